"""pulse_analysis: figures and tables from pulse's outputs (Debian's python3 with numpy and
matplotlib). `python3 -m pulse_analysis absorb absorption.json -o DIR`."""
