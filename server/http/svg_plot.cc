#include "server/http/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/http/html.h"

namespace prefixd {
namespace {

// The drawing's size and the plot area's margins, in SVG units (pixels).
constexpr double kWidth = 560, kHeight = 170;
constexpr double kLeft = 58, kRight = 12, kTop = 10, kBottom = 22;
// Line colours, in the order of a plot's lines.
constexpr const char* kColours[] = {"#3b7ddd", "#d64545", "#2f9e62",
                                    "#c98a12", "#8a5cc7", "#5b6578"};

const char* Colour(size_t i) {
  return kColours[i % (sizeof(kColours) / sizeof(kColours[0]))];
}

// A value as the axis and the data attributes show it: %g, "nan" for a gap.
std::string Number(double v) {
  return std::isnan(v) ? "nan" : absl::StrFormat("%g", v);
}

double YMax(const Plot& plot) {
  if (plot.y_max > 0) return plot.y_max;
  double top = 0;
  for (const PlotLine& line : plot.lines) {
    for (double v : line.values) {
      if (!std::isnan(v)) top = std::max(top, v);
    }
  }
  return NiceCeiling(top);
}

// The grid, the y axis' labels (0, half, top) and the x axis' (the span
// ago, half of it, now).
std::string Axes(const Plot& plot, double y_max) {
  const double w = kWidth - kLeft - kRight, h = kHeight - kTop - kBottom;
  std::string out = absl::StrFormat(
      "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"#fff\" "
      "stroke=\"#c9ced8\"/>",
      kLeft, kTop, w, h);
  for (int i = 0; i <= 2; ++i) {
    const double y = kTop + h * (1 - i / 2.0);
    absl::StrAppendFormat(
        &out,
        "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#e3e7ee\"/>"
        "<text x=\"%g\" y=\"%g\" text-anchor=\"end\" font-size=\"11\" "
        "fill=\"#667085\">%s%s</text>",
        kLeft, y, kLeft + w, y, kLeft - 4, y + 4, Number(y_max * i / 2),
        HtmlEscape(plot.unit));
  }
  const int minutes = static_cast<int>(absl::ToInt64Minutes(plot.span));
  const std::string ago[] = {absl::StrCat("-", minutes, " min"),
                             absl::StrCat("-", minutes / 2, " min"), "now"};
  const char* anchor[] = {"start", "middle", "end"};
  for (int i = 0; i <= 2; ++i) {
    absl::StrAppendFormat(&out,
                          "<text x=\"%g\" y=\"%g\" text-anchor=\"%s\" "
                          "font-size=\"11\" fill=\"#667085\">%s</text>",
                          kLeft + w * i / 2.0, kHeight - 6, anchor[i], ago[i]);
  }
  return out;
}

// One line as a <path>: a gap (NaN) lifts the pen.
std::string Path(const Plot& plot, const PlotLine& line, double y_max,
                 const char* colour) {
  const double w = kWidth - kLeft - kRight, h = kHeight - kTop - kBottom;
  const absl::Time start = plot.end - plot.span;
  std::string d;
  bool pen_down = false;
  std::vector<std::string> times, values;
  for (size_t i = 0; i < line.values.size(); ++i) {
    const double v = line.values[i];
    times.push_back(absl::StrCat(absl::ToUnixSeconds(line.times[i])));
    values.push_back(Number(v));
    if (std::isnan(v) || line.times[i] < start) {
      pen_down = false;
      continue;
    }
    const double x =
        kLeft + w * absl::FDivDuration(line.times[i] - start, plot.span);
    const double y = kTop + h * (1 - std::min(v, y_max) / y_max);
    // A lone point is drawn as a dot: a zero-length segment, round caps.
    if (pen_down) {
      absl::StrAppendFormat(&d, "L%.1f %.1f ", x, y);
    } else {
      absl::StrAppendFormat(&d, "M%.1f %.1f l0 0 ", x, y);
    }
    pen_down = true;
  }
  std::string data;
  for (const auto& [name, series] : line.data) {
    absl::StrAppend(&data, " data-", name, "=\"",
                    absl::StrJoin(series, " ",
                                  [](std::string* out, double v) {
                                    out->append(Number(v));
                                  }),
                    "\"");
  }
  return absl::StrCat("<path data-series=\"", HtmlEscape(line.name),
                      "\" data-times=\"", absl::StrJoin(times, " "),
                      "\" data-values=\"", absl::StrJoin(values, " "), "\"",
                      data, " d=\"", d, "\" fill=\"none\" stroke=\"", colour,
                      "\" stroke-width=\"2\" stroke-linecap=\"round\" "
                      "stroke-linejoin=\"round\"/>");
}

}  // namespace

double NiceCeiling(double v) {
  if (!(v > 0)) return 1;
  const double power = std::pow(10.0, std::floor(std::log10(v)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * power >= v) return m * power;
  }
  return 10 * power;
}

std::string SvgPlot(const Plot& plot) {
  const double y_max = YMax(plot);
  std::string out = absl::StrFormat(
      "<figure class=\"plot\" id=\"%s\"><figcaption>%s</figcaption>"
      "<svg width=\"%g\" height=\"%g\" "
      "viewBox=\"0 0 %g %g\" role=\"img\" aria-label=\"%s\">",
      plot.id, HtmlEscape(plot.title), kWidth, kHeight, kWidth, kHeight,
      HtmlEscape(plot.title));
  out += Axes(plot, y_max);
  std::string legend = "<div class=\"legend\">";
  for (size_t i = 0; i < plot.lines.size(); ++i) {
    out += Path(plot, plot.lines[i], y_max, Colour(i));
    absl::StrAppend(&legend,
                    "<span class=\"key\" style=\"background:", Colour(i),
                    "\"></span>", HtmlEscape(plot.lines[i].name));
  }
  return absl::StrCat(out, "</svg>", legend, "</div></figure>\n");
}

}  // namespace prefixd
