"""`python -m reslm.cli ...`: the same as the `reslm` command."""
import sys

from reslm.cli import main


sys.exit(main())
