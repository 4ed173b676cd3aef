import sys

from haarvest.cli import main

sys.exit(main())
