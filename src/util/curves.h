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

// One titled panel of curves sharing an axis.
struct CurvePanel {
  std::string title;
  std::vector<Curve> curves;
};

}  // namespace vit
