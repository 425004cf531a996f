sbp.placement @m cpu ranks [0, 1, 2] mesh [2, 2]
