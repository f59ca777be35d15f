/**
 * SVG charts for `monkeytree simulate --plot DIR`: plain strings, no dependencies, readable
 * in any browser. Line charts for slowdown against load and fragmentation over time, each
 * series with its own colour and marker; a bar chart for moves per defragmentation event.
 * What stands for data (lines, markers, bars) has the class `mark`.
 */
export interface Series {
  readonly name: string;
  readonly points: readonly (readonly [x: number, y: number])[];
}

export interface LineChart {
  readonly title: string;
  readonly xLabel: string;
  readonly yLabel: string;
  readonly series: readonly Series[];
  /** Hold each value until the next point (a quantity that changes at events). */
  readonly step?: boolean;
  /** Where the y axis starts unless a value lies below (default 0). */
  readonly yFrom?: number;
  /** Names for x = 0, 1, …, in place of numbers: a chart over a preset's variants. */
  readonly xNames?: readonly string[];
}

const WIDTH = 720;
const HEIGHT = 420;
const MARGIN = { left: 64, right: 180, top: 40, bottom: 52 };
const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
/** Shapes that tell nine series apart where colours alone do not (in print, to a colour-blind reader). */
const MARKERS = ["circle", "square", "triangle", "diamond", "down", "cross", "plus", "star", "bar"] as const;
/** Points per series drawn at most; longer series are thinned evenly. */
const MAX_POINTS = 2000;

export const escape = (text: string) => text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
const number = (value: number) => (Math.abs(value) >= 100 ? value.toFixed(0) : Number(value.toPrecision(3)).toString());

/** Five or so round tick values covering [low, high]. */
function ticks(low: number, high: number): number[] {
  const span = high - low || 1;
  const raw = span / 5;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * magnitude).find((s) => s >= raw) ?? raw;
  const out: number[] = [];
  for (let t = Math.ceil(low / step) * step; t <= high + step * 1e-9; t += step) out.push(Number(t.toPrecision(12)));
  return out;
}

/** Series `i`'s marker at (x, y). */
function marker(i: number, x: number, y: number, colour: string): string {
  const r = 3.5;
  const at = (points: readonly (readonly [number, number])[]) => points.map(([dx, dy]) => `${(x + dx * r).toFixed(1)},${(y + dy * r).toFixed(1)}`).join(" ");
  const polygon = (points: readonly (readonly [number, number])[]) => `<polygon class="mark" points="${at(points)}" fill="${colour}"/>`;
  const strokes = (points: readonly (readonly [number, number])[]) =>
    `<polyline class="mark" points="${at(points)}" fill="none" stroke="${colour}" stroke-width="1.8"/>`;
  const shape = MARKERS[i % MARKERS.length]!;
  switch (shape) {
    case "circle":
      return `<circle class="mark" cx="${x.toFixed(1)}" cy="${y.toFixed(1)}" r="${r}" fill="${colour}"/>`;
    case "square":
      return polygon([
        [-1, -1],
        [1, -1],
        [1, 1],
        [-1, 1],
      ]);
    case "triangle":
      return polygon([
        [0, -1.2],
        [1.1, 0.9],
        [-1.1, 0.9],
      ]);
    case "diamond":
      return polygon([
        [0, -1.3],
        [1.3, 0],
        [0, 1.3],
        [-1.3, 0],
      ]);
    case "down":
      return polygon([
        [0, 1.2],
        [1.1, -0.9],
        [-1.1, -0.9],
      ]);
    case "cross":
      return strokes([
        [-1, -1],
        [1, 1],
        [0, 0],
        [1, -1],
        [-1, 1],
      ]);
    case "plus":
      return strokes([
        [-1.3, 0],
        [1.3, 0],
        [0, 0],
        [0, -1.3],
        [0, 1.3],
      ]);
    case "star":
      return polygon(
        Array.from({ length: 10 }, (_, k) => [Math.sin((k * Math.PI) / 5) * (k % 2 ? 0.6 : 1.4), -Math.cos((k * Math.PI) / 5) * (k % 2 ? 0.6 : 1.4)] as const),
      );
    case "bar":
      return `<rect class="mark" x="${(x - r * 1.3).toFixed(1)}" y="${(y - r * 0.45).toFixed(1)}" width="${(r * 2.6).toFixed(1)}" height="${(r * 0.9).toFixed(1)}" fill="${colour}"/>`;
    default:
      return shape satisfies never;
  }
}

function frame(title: string, xLabel: string, yLabel: string, body: string[]): string {
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${WIDTH}" height="${HEIGHT}" viewBox="0 0 ${WIDTH} ${HEIGHT}" font-family="sans-serif" font-size="12">`,
    `<rect width="${WIDTH}" height="${HEIGHT}" fill="white"/>`,
    `<text x="${WIDTH / 2}" y="22" text-anchor="middle" font-size="15">${escape(title)}</text>`,
    `<text x="${MARGIN.left + (WIDTH - MARGIN.left - MARGIN.right) / 2}" y="${HEIGHT - 12}" text-anchor="middle">${escape(xLabel)}</text>`,
    `<text transform="translate(16 ${MARGIN.top + (HEIGHT - MARGIN.top - MARGIN.bottom) / 2}) rotate(-90)" text-anchor="middle">${escape(yLabel)}</text>`,
    ...body,
    "</svg>",
    "",
  ].join("\n");
}

export function lineChart(chart: LineChart): string {
  const all = chart.series.flatMap((s) => s.points);
  const xs = all.map(([x]) => x);
  const ys = all.map(([, y]) => y);
  const xLow = Math.min(...xs, Infinity);
  const xHigh = Math.max(...xs, -Infinity);
  const yLow = Math.min(chart.yFrom ?? 0, ...ys);
  // Flat data (every system at a slowdown of 1) still gets an axis of distinct ticks.
  const yHigh = Math.max(...ys, yLow + Math.max(1e-9, Math.abs(yLow) * 0.05));
  const xTicks = chart.xNames ? chart.xNames.map((_, k) => k) : all.length ? ticks(xLow, xHigh) : [];
  const yTicks = ticks(yLow, yHigh);
  const x0 = Math.min(xLow, xTicks[0] ?? xLow);
  const x1 = Math.max(xHigh, xTicks[xTicks.length - 1] ?? xHigh);
  const y1 = Math.max(yHigh, yTicks[yTicks.length - 1] ?? yHigh);
  const plotW = WIDTH - MARGIN.left - MARGIN.right;
  const plotH = HEIGHT - MARGIN.top - MARGIN.bottom;
  const px = (x: number) => MARGIN.left + (x1 > x0 ? ((x - x0) / (x1 - x0)) * plotW : plotW / 2);
  const py = (y: number) => MARGIN.top + plotH - ((y - yLow) / (y1 - yLow || 1)) * plotH;
  const body: string[] = [
    `<rect x="${MARGIN.left}" y="${MARGIN.top}" width="${plotW}" height="${plotH}" fill="none" stroke="#999"/>`,
    ...yTicks.map(
      (t) =>
        `<line x1="${MARGIN.left}" x2="${MARGIN.left + plotW}" y1="${py(t).toFixed(1)}" y2="${py(t).toFixed(1)}" stroke="#eee"/><text x="${MARGIN.left - 6}" y="${(py(t) + 4).toFixed(1)}" text-anchor="end">${number(t)}</text>`,
    ),
    ...xTicks.map((t) => `<text x="${px(t).toFixed(1)}" y="${MARGIN.top + plotH + 18}" text-anchor="middle">${escape(chart.xNames?.[t] ?? number(t))}</text>`),
  ];
  chart.series.forEach((series, i) => {
    const colour = COLOURS[i % COLOURS.length]!;
    const every = Math.max(1, Math.ceil(series.points.length / MAX_POINTS));
    const points = series.points.filter((_, k) => k % every === 0 || k === series.points.length - 1);
    const coords: string[] = [];
    points.forEach(([x, y], k) => {
      if (chart.step && k > 0) coords.push(`${px(x).toFixed(1)},${py(points[k - 1]![1]).toFixed(1)}`);
      coords.push(`${px(x).toFixed(1)},${py(y).toFixed(1)}`);
    });
    if (coords.length) body.push(`<polyline class="mark" fill="none" stroke="${colour}" stroke-width="1.6" points="${coords.join(" ")}"/>`);
    if (!chart.step) for (const [x, y] of points) body.push(marker(i, px(x), py(y), colour));
    const ly = MARGIN.top + 8 + i * 18;
    body.push(`<line x1="${WIDTH - MARGIN.right + 12}" x2="${WIDTH - MARGIN.right + 32}" y1="${ly}" y2="${ly}" stroke="${colour}" stroke-width="2"/>`);
    if (!chart.step) body.push(marker(i, WIDTH - MARGIN.right + 22, ly, colour));
    body.push(`<text x="${WIDTH - MARGIN.right + 38}" y="${ly + 4}">${escape(series.name)}</text>`);
  });
  return frame(chart.title, chart.xLabel, chart.yLabel, body);
}

export function barChart(title: string, xLabel: string, yLabel: string, bars: readonly (readonly [label: string, value: number])[]): string {
  const high = Math.max(1e-9, ...bars.map(([, v]) => v));
  const yTicks = ticks(0, high);
  const top = Math.max(high, yTicks[yTicks.length - 1] ?? high);
  const plotW = WIDTH - MARGIN.left - MARGIN.right;
  const plotH = HEIGHT - MARGIN.top - MARGIN.bottom;
  const slot = plotW / Math.max(1, bars.length);
  const py = (y: number) => MARGIN.top + plotH - (y / top) * plotH;
  const body: string[] = [
    `<rect x="${MARGIN.left}" y="${MARGIN.top}" width="${plotW}" height="${plotH}" fill="none" stroke="#999"/>`,
    ...yTicks.map(
      (t) =>
        `<line x1="${MARGIN.left}" x2="${MARGIN.left + plotW}" y1="${py(t).toFixed(1)}" y2="${py(t).toFixed(1)}" stroke="#eee"/><text x="${MARGIN.left - 6}" y="${(py(t) + 4).toFixed(1)}" text-anchor="end">${number(t)}</text>`,
    ),
  ];
  bars.forEach(([label, value], i) => {
    const x = MARGIN.left + i * slot + slot * 0.15;
    body.push(
      `<rect class="mark" x="${x.toFixed(1)}" y="${py(value).toFixed(1)}" width="${(slot * 0.7).toFixed(1)}" height="${(MARGIN.top + plotH - py(value)).toFixed(1)}" fill="${COLOURS[0]}"/>`,
    );
    body.push(`<text x="${(x + slot * 0.35).toFixed(1)}" y="${MARGIN.top + plotH + 18}" text-anchor="middle">${escape(label)}</text>`);
  });
  return frame(title, xLabel, yLabel, body);
}
