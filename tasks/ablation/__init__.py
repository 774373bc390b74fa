"""The ablation: its arms, the statistics its report tests with, the report, its curves and figures."""
