import { pooledMoveEvents, type SimulationReport, type SystemReport } from "../../controller/simulator/index.ts";
import { headlineTable } from "./headlines.ts";
import { barChart, escape, lineChart, type Series } from "./plot.ts";

/**
 * `monkeytree simulate --report DIR`'s page: one HTML file, no dependencies, that shows a run
 * as the paper shows its figure. The paper's headline numbers beside ours where the preset
 * stands for a figure, a chart per preset variant (small multiples, where one chart's lines
 * would pile up), fragmentation over time, moves per event and every run's numbers.
 */

/** One run's fragmentation over time. */
export interface FragmentationSeries {
  readonly load: number | null;
  readonly variant: string | null;
  readonly busiest: Series;
  readonly total: Series;
}

/** One chart: its caption, and the file name `--plot DIR` gives it. */
export interface Figure {
  readonly name: string;
  readonly caption: string;
  readonly svg: string;
}

const percent = (load: number | null) => (load === null ? "trace" : `${Math.round(load * 100)}%`);

/**
 * The page of one run (`reports` of one seed), or of one preset's runs over several seeds
 * (`--merge`): the paper's numbers beside ours as their mean and range, the charts of the mean
 * over seeds, and every seed's runs.
 */
export function reportPage(reports: readonly SimulationReport[], fragmentation: readonly FragmentationSeries[]): string {
  const report = meanOverSeeds(reports);
  const title = report.preset === null ? "MonkeyTree simulation" : `MonkeyTree simulation: ${report.preset}`;
  return [
    "<!doctype html>",
    '<html lang="en">',
    `<head><meta charset="utf-8"><title>${escape(title)}</title><style>${STYLE}</style></head>`,
    "<body>",
    `<h1>${escape(title)}</h1>`,
    `<p>${escape(settings(report, reports))}</p>`,
    headlines(reports),
    "<h2>Figures</h2>",
    '<div class="figures">',
    ...charts(report, fragmentation).map((f) => `<figure>${f.svg}<figcaption>${escape(f.caption)}</figcaption></figure>`),
    "</div>",
    "<h2>Every run</h2>",
    runTable(reports),
    `<script>${SELF_CHECK}</script>`,
    "</body>",
    "</html>",
    "",
  ].join("\n");
}

/** Every chart of a run (or the mean of several seeds' runs), in the page's order. */
export function figures(reports: readonly SimulationReport[], fragmentation: readonly FragmentationSeries[]): Figure[] {
  return charts(meanOverSeeds(reports), fragmentation);
}

function charts(report: SimulationReport, fragmentation: readonly FragmentationSeries[]): Figure[] {
  return [...slowdownFigures(report), ...fragmentationFigures(fragmentation), ...movesFigure(report)];
}

/** One report whose slowdowns are the mean over `reports`' seeds, and whose moves per event are every seed's. */
function meanOverSeeds(reports: readonly SimulationReport[]): SimulationReport {
  const [first] = reports;
  if (first === undefined) throw new RangeError("a report page needs at least one report");
  if (reports.length === 1) return first;
  const key = (s: SystemReport) => `${s.name}/${s.load}/${s.variant}`;
  const all = reports.flatMap((r) => r.systems);
  const systems = [...new Map(all.map((s) => [key(s), s] as const)).values()].map((s) => {
    const same = all.filter((o) => key(o) === key(s));
    const mean = (pick: (o: SystemReport) => number) => same.reduce((sum, o) => sum + pick(o), 0) / same.length;
    return {
      ...s,
      slowdown: { avg: mean((o) => o.slowdown.avg), p50: mean((o) => o.slowdown.p50), p90: mean((o) => o.slowdown.p90), p99: mean((o) => o.slowdown.p99) },
    };
  });
  return { ...first, systems, events: pooledMoveEvents(all) };
}

function settings(report: SimulationReport, reports: readonly SimulationReport[]): string {
  const { config } = report;
  const f = config.fabric;
  const loads = [...new Set(report.systems.map((s) => percent(s.load)))].join(", ");
  const systems = [...new Set(report.systems.map((s) => s.name))].join(", ");
  return (
    `${f.racks} racks × ${f.hostsPerRack} hosts × ${f.gpusPerHost} GPUs, ${f.uplinksPerRack} uplinks per rack, λ = ${config.lambda ?? f.uplinksPerRack}; ` +
    `${reports.length > 1 ? `seeds ${reports.map((r) => r.config.seed).join(", ")} (charts: their mean)` : `seed ${config.seed}`}; loads ${loads}; systems ${systems}; ${config.scheduler} front-end, queue ${config.queue} (${config.queueInMoves} while moving), ` +
    `restart ${config.restartSeconds} s, plan time ${config.planTime}, plans moved by ${config.migrateBy}` +
    (report.variants.length ? `; variants ${report.variants.map((v) => v.name).join(", ")}` : "")
  );
}

/** The paper's numbers for the preset beside ours (`headlineTable`), as HTML. */
function headlines(reports: readonly SimulationReport[]): string {
  const found = headlineTable(reports);
  return found ? ["<h2>The paper's numbers beside ours</h2>", table(found.header, found.rows)].join("\n") : "";
}

/** p99 and average slowdown against load, a chart per variant; against the variants where the preset runs one load. */
function slowdownFigures(report: SimulationReport): Figure[] {
  const variants = [...new Set(report.systems.map((s) => s.variant))];
  const loads = [...new Set(report.systems.map((s) => s.load))];
  const systems = [...new Set(report.systems.map((s) => s.name))];
  const charts: Figure[] = [];
  for (const [stat, title] of [
    ["p99", "p99 job slowdown"],
    ["avg", "average job slowdown"],
  ] as const) {
    if (loads.length > 1 || variants.length === 1) {
      for (const variant of variants) {
        const runs = report.systems.filter((s) => s.variant === variant);
        const series = systems.map((name) => ({
          name,
          points: runs.filter((s) => s.name === name).map((s) => [100 * (s.load ?? 1), s.slowdown[stat]] as const),
        }));
        const caption = variant === null ? title : `${title}, ${variant}`;
        charts.push({
          name: `slowdown-${stat}${variant === null ? "" : `-${variant}`}`,
          caption,
          svg: lineChart({ title: caption, xLabel: "offered load (%)", yLabel: "JCT ÷ ideal JCT", series, yFrom: 1 }),
        });
      }
    } else {
      const names = variants.map((v) => v ?? "");
      const series = systems.map((name) => ({
        name,
        points: report.systems.filter((s) => s.name === name).map((s) => [names.indexOf(s.variant ?? ""), s.slowdown[stat]] as const),
      }));
      const caption = `${title} at ${percent(loads[0] ?? null)} load`;
      charts.push({
        name: `slowdown-${stat}`,
        caption,
        svg: lineChart({ title: caption, xLabel: "variant", yLabel: "JCT ÷ ideal JCT", series, yFrom: 1, xNames: names }),
      });
    }
  }
  return charts;
}

/** The busiest rack's and the total fragmentation over time, a chart per load and variant. */
function fragmentationFigures(fragmentation: readonly FragmentationSeries[]): Figure[] {
  const keys = [...new Map(fragmentation.map((f) => [`${f.load}/${f.variant}`, f] as const)).values()];
  return keys.flatMap(({ load, variant }) => {
    const runs = fragmentation.filter((f) => f.load === load && f.variant === variant);
    const suffix = [load === null ? "" : ` at ${percent(load)} load`, variant === null ? "" : `, ${variant}`].join("");
    const busiest = `busiest rack's fragmentation${suffix}`;
    const total = `total fragmentation${suffix}`;
    const name = `${load ?? "trace"}${variant === null ? "" : `-${variant}`}`;
    return [
      {
        name: `fragmentation-${name}`,
        caption: busiest,
        svg: lineChart({ title: busiest, xLabel: "hours", yLabel: "max rings per rack", series: runs.map((f) => f.busiest), step: true }),
      },
      {
        name: `fragmentation-total-${name}`,
        caption: total,
        svg: lineChart({ title: total, xLabel: "hours", yLabel: "rings per rack, summed over racks", series: runs.map((f) => f.total), step: true }),
      },
    ];
  });
}

function movesFigure(report: SimulationReport): Figure[] {
  const histogram = Object.entries(report.events.moves.histogram).sort(([a], [b]) => Number(a) - Number(b));
  if (histogram.length === 0) return [];
  const caption = "moves per defragmentation event (MonkeyTree systems)";
  return [{ name: "moves", caption, svg: barChart(caption, "moves", "events", histogram) }];
}

function runTable(reports: readonly SimulationReport[]): string {
  const rows = reports.flatMap((r) => r.systems.map((s) => [String(r.config.seed), ...runCells(s)]));
  return table(["seed", "variant", "load", "system", "jobs", "slowdown avg", "p50", "p90", "p99", "makespan h", "moves", "events", "moves/event"], rows);
}

function runCells(s: SystemReport): string[] {
  return [
    s.variant ?? "",
    percent(s.load),
    s.name,
    String(s.jobs),
    s.slowdown.avg.toFixed(3),
    s.slowdown.p50.toFixed(3),
    s.slowdown.p90.toFixed(3),
    s.slowdown.p99.toFixed(3),
    (s.makespanSeconds / 3600).toFixed(1),
    String(s.migrations),
    String(s.events.count),
    s.events.count ? s.events.moves.avg.toFixed(2) : "",
  ];
}

function table(head: readonly string[], rows: readonly (readonly string[])[]): string {
  const line = (cells: readonly string[], tag: string) => `<tr>${cells.map((c) => `<${tag}>${escape(c)}</${tag}>`).join("")}</tr>`;
  return `<table><thead>${line(head, "th")}</thead><tbody>${rows.map((r) => line(r, "td")).join("")}</tbody></table>`;
}

const STYLE = [
  "body{font-family:sans-serif;margin:2em;max-width:1500px}",
  "table{border-collapse:collapse;margin:1em 0}",
  "th,td{border:1px solid #ccc;padding:2px 8px;text-align:right}",
  "th:nth-child(-n+4),td:nth-child(-n+4){text-align:left}",
  ".figures{display:grid;grid-template-columns:repeat(auto-fill,minmax(480px,1fr));gap:1em}",
  "figure{margin:0}",
  "figure svg{width:100%;height:auto}",
  "figcaption{font-size:90%;color:#555}",
].join("");

/**
 * The page checks its own figures once laid out: a figure is drawn when its SVG has a size and
 * its data a mark of some extent (`plot.ts` marks lines, markers and bars). The counts land on
 * `<body>` (`data-figures`, `data-drawn`), where a headless browser's DOM dump shows them.
 */
const SELF_CHECK = [
  "addEventListener('load',()=>{",
  "const figures=[...document.querySelectorAll('figure svg')];",
  "const drawn=figures.filter((svg)=>{const box=svg.getBoundingClientRect();",
  "return box.width>0&&box.height>0&&[...svg.querySelectorAll('.mark')].some((m)=>{const b=m.getBBox();return b.width+b.height>0;});});",
  "document.body.dataset.figures=String(figures.length);document.body.dataset.drawn=String(drawn.length);});",
].join("");
