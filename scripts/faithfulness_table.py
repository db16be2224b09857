#!/usr/bin/env python3
"""Prints the faithfulness table of a `vit export-attention --faithfulness` folder (DIR/summary.json) as Markdown.

Usage: faithfulness_table.py DIR/summary.json. Stdlib only. Columns: the mean AUC per method of deletion and positive
perturbation (lower is better), insertion and negative perturbation (higher is better), the accuracy AUCs of the
perturbation test, and the share of images on which the method's deletion AUC beats the random order's.
"""
import json
import sys


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    path = sys.argv[1]
    with open(path, encoding="utf-8") as f:
        summary = json.load(f)
    if "faithfulness" not in summary:
        raise SystemExit(f"{path}: no faithfulness (was export-attention run with --faithfulness?)")
    f = summary["faithfulness"]
    columns = [("deletion", "deletion ↓"), ("insertion", "insertion ↑"), ("positive", "positive pert. ↓"),
               ("negative", "negative pert. ↑"), ("positive_accuracy", "pos. pert. accuracy ↓"),
               ("negative_accuracy", "neg. pert. accuracy ↑"), ("deletion_beats_random", "deletion beats random")]
    print(f"{f['images']} images, mean AUC per method")
    print()
    print("| method | " + " | ".join(title for _, title in columns) + " |")
    print("|---|" + "---|" * len(columns))
    for row in f["table"]:
        cells = []
        for key, _ in columns:
            value = row.get(key)
            if value is None:
                cells.append("")
            elif key == "deletion_beats_random":
                cells.append(f"{100 * value:.0f}%")
            else:
                cells.append(f"{value:.4f}")
        print(f"| {row['method']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
