"""`python -m loraserve.adapterctl`: the `adapterctl` command (see `entry`)."""

import sys

from loraserve.adapterctl.entry import main

if __name__ == "__main__":
    sys.exit(main())
