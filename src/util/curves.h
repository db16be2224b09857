// Plot data that training produces and the drawing code renders, kept here so neither depends on the other.
#pragma once

#include <string>
#include <vector>

namespace vit {

// One line of a plot: a name for the legend and one value per epoch (NaN = no point at that epoch).
struct Curve {
  std::string name;
  std::vector<double> values;
};

// One titled panel of curves sharing an axis: values[i] lies at x[i] when x is given, else at epoch i + 1.
struct CurvePanel {
  std::string title;
  std::vector<Curve> curves;
  std::vector<double> x;             // shared x coordinates (increasing); empty = epochs 1..N
  std::string x_label = "epoch";
  bool legend_below = false;         // legend in the lower right corner instead of the upper right
};

}  // namespace vit
