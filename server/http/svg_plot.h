// Line plots over time as inline SVG markup, for the status page: no
// script, no image, no other origin (server/http/html.h's policy holds).
//
//   Plot p{.id = "hit-rate", .title = "Hit rate", .unit = "%",
//          .end = now, .span = absl::Hours(1), .y_max = 100};
//   p.lines.push_back({"hit rate", times, values, {}});
//   page += SvgPlot(p);
//
// Each line is a <path data-series="NAME"> whose data-times (Unix seconds)
// and data-values carry the points drawn, and data-NAME each raw series of
// `data`, so that a test or a reader can check the picture against the
// numbers it shows.
//
// Thread safety: pure functions.
#ifndef PREFIXD_SERVER_HTTP_SVG_PLOT_H_
#define PREFIXD_SERVER_HTTP_SVG_PLOT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace prefixd {

struct PlotLine {
  std::string name;               // the legend's; escaped
  std::vector<absl::Time> times;  // ascending
  std::vector<double> values;     // one per time; NaN: a gap
  // Extra per-point series for data-<name> attributes (names: [a-z-]).
  std::vector<std::pair<std::string, std::vector<double>>> data;
};

struct Plot {
  std::string id;     // the <figure>'s id ([a-z-])
  std::string title;  // escaped
  std::string unit;   // of the values, shown on the y axis; escaped
  absl::Time end;     // the right edge (now)
  absl::Duration span = absl::Hours(1);
  double y_max = 0;  // the top of the y axis; 0: from the values
  std::vector<PlotLine> lines;
};

// A <figure> holding the plot, its axes and its legend.
std::string SvgPlot(const Plot& plot);

// The smallest 1, 2 or 5 times a power of ten at or above `v` (1 for v <= 0).
double NiceCeiling(double v);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_HTTP_SVG_PLOT_H_
