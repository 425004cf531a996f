// The pictures: Graphviz for graphs and plans, an SVG memory map for plans.
// RUN: sbp-opt %S/../passes/sbp-infer/megatron-mlp.mlir -p 'compile{to_plan=false}' -t dot | filecheck %s --check-prefix=GRAPH
// RUN: sbp-opt %S/../passes/sbp-infer/megatron-mlp.mlir -p compile -t dot | filecheck %s --check-prefix=PLAN
// RUN: sbp-opt %S/../passes/sbp-infer/megatron-mlp.mlir -p compile -t memory-svg | filecheck %s --check-prefix=SVG

// GRAPH:      digraph sbpc {
// GRAPH:        subgraph "cluster_megatron_mlp" {
// GRAPH:          megatron_mlp_1 [label="param \"w1\"", shape=box, style=rounded];
// GRAPH:          megatron_mlp_0 -> megatron_mlp_3 [label="B @tp"];
// GRAPH-NEXT:     megatron_mlp_1 -> megatron_mlp_3 [label="S<1> @tp"];
// GRAPH:          megatron_mlp_6 [label="all_reduce\n4096 B", shape=ellipse, color=red, fontcolor=red, penwidth=2];
// GRAPH-NEXT:     megatron_mlp_5 -> megatron_mlp_6 [label="P @tp", color=red];

// PLAN:      subgraph "cluster_megatron_mlp_rank0" {
// PLAN-NEXT:   label="@rank0 (rank 0)";
// PLAN-NEXT:   megatron_mlp_rank0_0 [label="matmul", shape=box];
// PLAN:        megatron_mlp_rank0_3 [label="all_reduce #0\n[0, 1]", shape=ellipse, color=red, fontcolor=red];
// PLAN-NEXT:   megatron_mlp_rank0_2 -> megatron_mlp_rank0_3 [label="@y\n4096 B"];
// PLAN:      megatron_mlp_rank0_3 -> megatron_mlp_rank1_3 [style=dashed, dir=none, color=red, constraint=false];

// SVG:      <svg xmlns="http://www.w3.org/2000/svg"
// SVG:      @megatron_mlp @rank0: arena 12288 B, live-set bound 12288 B, without reuse 28672 B, persistent 65536 B
// SVG:      <title>@x: 4096 B at 8192, live -1..0</title>
// SVG:      <title>@yb: 4096 B at 0, live 3..4</title>
// SVG:      @megatron_mlp @rank1:
// SVG:      </svg>
