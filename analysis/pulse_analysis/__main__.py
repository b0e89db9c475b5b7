import argparse

from . import absorb


def main():
    parser = argparse.ArgumentParser(prog="python3 -m pulse_analysis")
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("absorb", help="figures and table of a pulse-absorb run")
    a.add_argument("json", help="absorption.json written by pulse-absorb")
    a.add_argument("-o", "--out", required=True, help="output folder")
    args = parser.parse_args()
    if args.command == "absorb":
        for row in absorb.write_report(args.json, args.out):
            print(f"k={row['k']:>2}: mean {100 * row['mean_sparsity']:.3f}%  min {100 * row['min_sparsity']:.3f}%"
                  f"  over {row['steps']} steps")


main()
