import type { PresetName } from "./presets.ts";
import { pooledMoveEvents, type SimulationReport, type SystemReport } from "./report.ts";

/**
 * The paper's headline numbers, each with how a report of its figure's preset measures ours:
 * the numbers `docs/paper-evaluation.md` compares, declared once so that a report shows the
 * paper's beside every run's own. The paper's come from the artifact's plotted data, or its
 * text where the artifact has none.
 */
export interface Headline {
  readonly preset: PresetName;
  readonly figure: string;
  readonly label: string;
  readonly paper: number;
  /** Decimals to show both with: 0 for counts. */
  readonly digits: number;
  /** Ours, from a report of `preset`; null where the run left out what it needs (a load, a variant, a system). */
  readonly measure: (report: SimulationReport) => number | null;
}

type Measure = Headline["measure"];

const run = (report: SimulationReport, system: string, load: number, variant: string | null): SystemReport | undefined =>
  report.systems.find((s) => s.name === system && s.load === load && s.variant === variant);

const of =
  (pick: (s: SystemReport) => number | null | undefined) =>
  (system: string, load: number, variant: string | null = null): Measure =>
  (report) => {
    const found = run(report, system, load, variant);
    return found === undefined ? null : (pick(found) ?? null);
  };

const p99 = of((s) => s.slowdown.p99);
const average = of((s) => s.slowdown.avg);
const migrations = of((s) => s.migrations);
const medianMigration = of((s) => s.migrationSeconds?.p50);
const totalFragmentation = of((s) => s.fragmentation.meanTotal);
const makespan = of((s) => s.makespanSeconds);

const ratio =
  (a: Measure, b: Measure): Measure =>
  (report) => {
    const [x, y] = [a(report), b(report)];
    return x === null || y === null || y === 0 ? null : x / y;
  };

/** The lowest of the measures that the report has. */
const lowest =
  (...measures: Measure[]): Measure =>
  (report) => {
    const values = measures.map((m) => m(report)).filter((v): v is number => v !== null);
    return values.length ? Math.min(...values) : null;
  };

/** A variant's defragmentation events over every load it ran: moves per event, or the share of 1 or 2 (%). */
const pooledEvents =
  (variant: string, what: "avg" | "shareOneOrTwo"): Measure =>
  (report) => {
    const events = pooledMoveEvents(report.systems.filter((s) => s.variant === variant));
    if (events.count === 0) return null;
    return what === "avg" ? events.moves.avg : 100 * events.moves.shareOneOrTwo;
  };

const MT = "monkeytree";

export const HEADLINES: readonly Headline[] = [
  { preset: "fig-slowdown", figure: "6", label: "MonkeyTree p99, 100% load", digits: 3, paper: 1.044, measure: p99(MT, 1) },
  {
    preset: "fig-slowdown",
    figure: "6",
    label: "best routing alone's p99 ÷ MonkeyTree's, 100%",
    digits: 2,
    paper: 1.58,
    measure: ratio(lowest(...["ecmp", "crux", "sglb", "perfect"].map((s) => p99(s, 1))), p99(MT, 1)),
  },
  { preset: "fig-slowdown", figure: "6", label: "ECMP p99 ÷ MonkeyTree's, 100%", digits: 2, paper: 3.59, measure: ratio(p99("ecmp", 1), p99(MT, 1)) },
  {
    preset: "fig-slowdown",
    figure: "6",
    label: "ECMP p99 ÷ MonkeyTree-ECMP's, 100%",
    digits: 2,
    paper: 1.5,
    measure: ratio(p99("ecmp", 1), p99("monkeytree-ecmp", 1)),
  },
  {
    preset: "fig-fragmentation",
    figure: "7",
    label: "Crux total fragmentation ÷ MonkeyTree's, 90%",
    digits: 2,
    paper: 4.85,
    measure: ratio(totalFragmentation("crux", 0.9), totalFragmentation(MT, 0.9)),
  },
  {
    preset: "fig-fragmentation",
    figure: "7",
    label: "Crux makespan ÷ MonkeyTree's, 90%",
    digits: 2,
    paper: 1.25,
    measure: ratio(makespan("crux", 0.9), makespan(MT, 0.9)),
  },
  {
    preset: "fig-fragmentation",
    figure: "7",
    label: "ECMP makespan ÷ MonkeyTree's, 90%",
    digits: 2,
    paper: 1.7,
    measure: ratio(makespan("ecmp", 0.9), makespan(MT, 0.9)),
  },
  {
    preset: "fig-oversubscription",
    figure: "8",
    label: "MonkeyTree p99, 256 GPUs / 16 uplinks per rack",
    digits: 3,
    paper: 1.047,
    measure: p99(MT, 0.8, "g256-u16"),
  },
  { preset: "fig-oversubscription", figure: "8", label: "Crux p99, 256 GPUs / 64 uplinks", digits: 3, paper: 1.105, measure: p99("crux", 0.8, "g256-u64") },
  { preset: "fig-oversubscription", figure: "8", label: "Crux p99, 128 GPUs / 32 uplinks", digits: 3, paper: 1.271, measure: p99("crux", 0.8, "g128-u32") },
  {
    preset: "fig-oversubscription",
    figure: "8",
    label: "ECMP average slowdown, 16 GPUs / 16 uplinks",
    digits: 3,
    paper: 1.498,
    measure: average("ecmp", 0.8, "g16-u16"),
  },
  { preset: "fig-oversubscription", figure: "8", label: "SGLB p99, 256 GPUs / 64 uplinks", digits: 3, paper: 1.085, measure: p99("sglb", 0.8, "g256-u64") },
  ...(["256", "1024", "2048"] as const).flatMap((gpus): Headline[] => [
    {
      preset: "fig-moves",
      figure: "9",
      label: `moves per event, ${gpus} GPUs`,
      digits: 2,
      paper: { 256: 1.73, 1024: 1.78, 2048: 1.73 }[gpus],
      measure: pooledEvents(`gpus-${gpus}`, "avg"),
    },
    {
      preset: "fig-moves",
      figure: "9",
      label: `events of 1 or 2 moves (%), ${gpus} GPUs`,
      digits: 1,
      paper: { 256: 94.9, 1024: 85.4, 2048: 88 }[gpus],
      measure: pooledEvents(`gpus-${gpus}`, "shareOneOrTwo"),
    },
  ]),
  {
    preset: "fig-migration-duration",
    figure: "12",
    label: "median migration, stop to restart, 100% (s)",
    digits: 1,
    paper: 11,
    measure: medianMigration(MT, 1),
  },
  { preset: "fig-threshold", figure: "13", label: "migrations at λ = 4", digits: 0, paper: 135, measure: migrations(MT, 1, "lambda-4") },
  { preset: "fig-threshold", figure: "13", label: "migrations at λ = 2", digits: 0, paper: 266, measure: migrations(MT, 1, "lambda-2") },
  { preset: "fig-threshold", figure: "13", label: "p99 at λ = 4", digits: 3, paper: 1.06, measure: p99(MT, 1, "lambda-4") },
  { preset: "fig-threshold", figure: "13", label: "p99 at λ = 8", digits: 3, paper: 1.831, measure: p99(MT, 1, "lambda-8") },
  { preset: "fig-rail", figure: "14a", label: "MonkeyTree p99, rail, 100%", digits: 3, paper: 1.017, measure: p99(MT, 1) },
  { preset: "fig-rail", figure: "14a", label: "SGLB p99, rail, 100%", digits: 3, paper: 1.517, measure: p99("sglb", 1) },
  { preset: "fig-3tier", figure: "14b", label: "MonkeyTree3 p99, 3-tier, 100%", digits: 3, paper: 1.015, measure: p99("monkeytree3", 1) },
  { preset: "fig-3tier", figure: "14b", label: "MonkeyTree (racks only) p99, 3-tier, 100%", digits: 3, paper: 1.486, measure: p99(MT, 1) },
  {
    preset: "fig-frontend",
    figure: "15",
    label: "migrations, FIFO ÷ best-fit, 100%",
    digits: 2,
    paper: 2.6,
    measure: ratio(migrations(MT, 1, "fifo"), migrations(MT, 1, "best-fit")),
  },
  { preset: "fig-frontend", figure: "15", label: "migrations, random front-end, 60%", digits: 0, paper: 1348, measure: migrations(MT, 0.6, "random") },
  { preset: "fig-ep", figure: "16", label: "MonkeyTree p99, 16 uplinks", digits: 3, paper: 1.619, measure: p99(MT, 1, "u16") },
  { preset: "fig-ep", figure: "16", label: "SGLB p99, 16 uplinks", digits: 3, paper: 2.15, measure: p99("sglb", 1, "u16") },
  { preset: "fig-ep", figure: "16", label: "ECMP p99, 16 uplinks", digits: 3, paper: 3.14, measure: p99("ecmp", 1, "u16") },
  { preset: "fig-ep", figure: "16", label: "MonkeyTree p99, 2 uplinks", digits: 3, paper: 5.203, measure: p99(MT, 1, "u2") },
];
