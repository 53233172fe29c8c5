"""The data plane, below the trainer, the workers and the models: a round's rows as one flat buffer per column
(columnar), per-row lists (row_lists), the driver's dock (driver_dock) and its balance plans (balance_plan)."""
