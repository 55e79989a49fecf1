"""python3 -m bench SUBCOMMAND [options]: see bench/__init__.py, or --help."""
import argparse
import sys

import bench
from bench import backends, memory, ncu_profile, readme, ring_scaling, sweep, varlen


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m bench", description=bench.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plugin", action="append", default=[],
                        help="import MODULE first (it may register backends)")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in (sweep, memory, varlen, ncu_profile, readme, ring_scaling):
        module.add_parser(subparsers)
    args = parser.parse_args(argv)
    backends.load_plugins(args.plugin)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
