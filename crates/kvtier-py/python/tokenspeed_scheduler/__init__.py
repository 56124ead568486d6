"""kvtier as a drop-in for TokenSpeed's scheduler module (`tokenspeed_scheduler` 0.1.0).

The same classes, fields, defaults and calling conventions as the reference module;
the scheduler behind them is kvtier's (`kvtier.compat`). The differences kvtier makes
on purpose are listed in kvtier's docs/python.md.
"""

from kvtier.compat import *  # noqa: F401,F403
from kvtier.compat import __all__  # noqa: F401
