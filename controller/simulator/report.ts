import { z } from "zod";
import { TraceGenerationSchema, type TraceGeneration } from "./jobs.ts";
import { SimConfigSchema, STALE_PLAN, type SimConfigInput, type PlanEvent, type SystemRun } from "./simulate.ts";
import { VariantSchema, type Variant } from "./presets.ts";

const Quantiles = z.strictObject({ avg: z.number(), p50: z.number(), p90: z.number(), p99: z.number() });

/** Defragmentation events: plans that moved workers, and how many each moved. */
export const MoveEventsSchema = z.strictObject({
  count: z.int().min(0),
  moves: z.strictObject({
    avg: z.number().min(0),
    /** Share of events that needed one or two moves (paper: about 80%). */
    shareOneOrTwo: z.number().min(0).max(1),
    /** Events by moves needed, keyed by the count as a decimal string. */
    histogram: z.record(z.string(), z.int().min(0)),
  }),
});
export type MoveEvents = z.infer<typeof MoveEventsSchema>;

export const SystemReportSchema = z.strictObject({
  name: z.string(),
  /** The preset's variant it ran (`SimulationReport.variants`); null for a preset that sweeps none. */
  variant: z.string().nullable(),
  load: z.number().nullable(),
  jobs: z.int().min(0),
  slowdown: Quantiles,
  makespanSeconds: z.number().min(0),
  /** Workers moved in all. */
  migrations: z.int().min(0),
  migrationsPerJob: z.strictObject({ avg: z.number().min(0), max: z.int().min(0) }),
  bytesMoved: z.number().min(0),
  migrationSeconds: Quantiles.nullable(),
  fragmentation: z.strictObject({
    peakMaxRack: z.number().min(0),
    meanMaxRack: z.number().min(0),
    meanRack: z.number().min(0),
    /** Sum of every rack's degree (the paper's total fragmentation, §7.3): peak and time average. */
    peakTotal: z.number().min(0),
    meanTotal: z.number().min(0),
    /** Time-averaged count of groups spread over more than one rack. */
    meanFragmentedGroups: z.number().min(0),
  }),
  solver: z.strictObject({
    plans: z.int().min(0),
    /** Plans dropped because the cluster changed while they were computed (`planTime: solve`). */
    stale: z.int().min(0),
    totalMs: z.number().min(0),
    p50Ms: z.number().min(0),
    p99Ms: z.number().min(0),
  }),
  events: MoveEventsSchema,
});
export type SystemReport = z.infer<typeof SystemReportSchema>;

/** The document `monkeytree simulate --json` prints. */
export const SimulationReportSchema = z.strictObject({
  /** The preset whose settings (and variants) ran, flags aside; null where none did. */
  preset: z.string().nullable(),
  /** What was simulated: the fabric, λ, front-end, seed, restart cost and plan budget. */
  config: SimConfigSchema,
  /** What each variant changes of `config`; empty for a preset that sweeps none. */
  variants: z.array(VariantSchema),
  /** How the traces were generated; null when they were replayed (`--trace`, `--from-sacct`). */
  generation: TraceGenerationSchema.nullable(),
  systems: z.array(SystemReportSchema),
  /** Defragmentation events of every MonkeyTree system together. */
  events: MoveEventsSchema,
});
export type SimulationReport = z.infer<typeof SimulationReportSchema>;

/** Nearest-rank quantile of sorted values; 0 for none. */
export function quantile(sorted: readonly number[], q: number): number {
  if (sorted.length === 0) return 0;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))]!;
}

function quantiles(values: readonly number[]): z.infer<typeof Quantiles> {
  const sorted = [...values].sort((a, b) => a - b);
  const avg = sorted.length ? sorted.reduce((a, b) => a + b, 0) / sorted.length : 0;
  return { avg, p50: quantile(sorted, 0.5), p90: quantile(sorted, 0.9), p99: quantile(sorted, 0.99) };
}

export function moveEvents(plans: readonly PlanEvent[]): MoveEvents {
  const histogram: Record<string, number> = {};
  for (const { moves } of plans) if (moves > 0) histogram[String(moves)] = (histogram[String(moves)] ?? 0) + 1;
  return eventsOf(histogram);
}

/** Moves per event over several runs (a variant's loads, a merge's parts), from each run's own histogram. */
export function pooledMoveEvents(systems: readonly SystemReport[]): MoveEvents {
  const histogram: Record<string, number> = {};
  for (const s of systems) for (const [moves, count] of Object.entries(s.events.moves.histogram)) histogram[moves] = (histogram[moves] ?? 0) + count;
  return eventsOf(histogram);
}

function eventsOf(histogram: Record<string, number>): MoveEvents {
  const entries = Object.entries(histogram).map(([moves, count]) => [Number(moves), count] as const);
  const count = entries.reduce((sum, [, n]) => sum + n, 0);
  const share = (weight: (moves: number) => number) => (count ? entries.reduce((sum, [moves, n]) => sum + weight(moves) * n, 0) / count : 0);
  return { count, moves: { avg: share((m) => m), shareOneOrTwo: share((m) => (m <= 2 ? 1 : 0)), histogram } };
}

export function systemReport(run: SystemRun, load: number | null, variant: string | null = null): SystemReport {
  const moves = run.jobs.map((j) => j.moves);
  const solve = run.plans.map((p) => p.solveMs).sort((a, b) => a - b);
  return {
    name: run.system,
    variant,
    load,
    jobs: run.jobs.length,
    slowdown: quantiles(run.jobs.map((j) => j.slowdown)),
    makespanSeconds: run.makespanSeconds,
    migrations: moves.reduce((a, b) => a + b, 0),
    migrationsPerJob: { avg: moves.length ? moves.reduce((a, b) => a + b, 0) / moves.length : 0, max: moves.reduce((a, b) => Math.max(a, b), 0) },
    bytesMoved: run.bytesMoved,
    migrationSeconds: run.migrationSeconds.length ? quantiles(run.migrationSeconds) : null,
    fragmentation: run.fragmentation,
    solver: {
      plans: solve.length,
      stale: run.plans.filter((p) => p.status === STALE_PLAN).length,
      totalMs: solve.reduce((a, b) => a + b, 0),
      p50Ms: quantile(solve, 0.5),
      p99Ms: quantile(solve, 0.99),
    },
    events: moveEvents(run.plans),
  };
}

export function simulationReport(
  config: SimConfigInput,
  runs: readonly { run: SystemRun; load: number | null; variant?: string | null }[],
  generation: TraceGeneration | null = null,
  preset: { preset: string; variants: readonly Variant[] } | null = null,
): SimulationReport {
  return {
    preset: preset?.preset ?? null,
    config: SimConfigSchema.parse(config),
    variants: [...(preset?.variants ?? [])],
    generation,
    systems: runs.map(({ run, load, variant }) => systemReport(run, load, variant ?? null)),
    events: moveEvents(runs.flatMap(({ run }) => run.plans)),
  };
}
