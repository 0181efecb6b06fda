"""`python -m lsm_gnn` is the `lsm-gnn` command."""
import sys

from lsm_gnn.cli import main

sys.exit(main())
