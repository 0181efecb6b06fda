"""The paper's evaluation (LSM-GNN, section 5) in one command: ``python -m benchmarks.paper --quick|--full``."""
