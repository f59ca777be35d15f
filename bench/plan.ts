// Planner benchmark: our formulation against the paper's (Appendix A) on the same clusters.
//
// Clusters come from `trace`: Poisson arrivals placed by the paper's best-fit scheduler at 90%
// load, taken each time a placement pushes a rack over its bound. Every event is planned twice,
// ours and the paper's, and the trace continues from our plan, as the controller would.
//
//   npm run bench:plan -- --sizes 1024,2048 --mix dp --events 20
import { bool, checked, choice, helpText, int, num, parseCommandFlags, seconds, str } from "../cli/flags.ts";
import { secondsFlag, table, UsageError } from "../cli/io.ts";
import { MAX_HOSTS, MAX_HOSTS_PER_RACK, MAX_RACKS } from "../sdk/contract/protocol/limits.ts";
import { benchMain } from "./entry.ts";
import type { Cluster, Placement } from "../controller/planner/model/cluster.ts";
import {
  createPlanner,
  PlanTimeoutError,
  type Formulation,
  type Plan,
  type Planner,
  type PlanProgress,
  type PlanStatus,
} from "../controller/planner/plan/index.ts";
import { constrain, MIXES, SCHEDULERS, trace, type Mix } from "../controller/simulator/index.ts";
import { anytimeTable, unchangedTable } from "./plan-tails.ts";

const GPUS_PER_HOST = 8;
/** λ = uplinksPerRack per mix: 2 for single-ring DP/FSDP jobs, 16 so a rack can hold two fragmented TP=8 groups. */
const UPLINKS: Record<Mix, number> = { dp: 2, tp8pp: 16 };
const FORMULATIONS = ["monkeytree", "paper"] as const satisfies readonly Formulation[];
const MOVE_BUCKETS = ["1", "2", "3", "4", "5+"] as const;
const STATUSES = ["unchanged", "optimal", "feasible", "infeasible", "timeout", "skipped"] as const satisfies readonly (PlanStatus | "timeout" | "skipped")[];
type Status = (typeof STATUSES)[number];

/** `--NAME A,B,…`: positive numbers, or none for an empty list. */
function positives(raw: string, name: string): number[] {
  if (raw === "none") return [];
  return raw.split(",").map((item) => {
    const value = Number(item);
    if (!(value > 0)) throw new UsageError(`--${name} takes positive numbers separated by commas, or none; got "${item}"`);
    return value;
  });
}

const FLAGS = {
  sizes: str("LIST", "GPU counts, multiples of a rack's GPUs", { default: "1024,2048,4096,8192" }),
  "hosts-per-rack": int("N", `hosts of ${GPUS_PER_HOST} GPUs in a rack`, { default: 8, min: 1, max: MAX_HOSTS_PER_RACK }),
  mix: choice([...MIXES, "all"], "the traces' jobs: DP/FSDP only (dp), TP=8 with pipeline stages among DP/FSDP (tp8pp), or each in turn", "all"),
  events: int("N", "violation events per size and mix", { default: 40, min: 1 }),
  seed: int("N", "trace seed", { default: 1, min: 0 }),
  "time-limit": seconds("SEC", "planner budget per plan", { default: 10, min: 0.001 }),
  "paper-limit": checked("SEC", "the paper's formulation's budget (default: --time-limit; 0 skips it)", (raw, name) => secondsFlag(name, raw, 0, 0)),
  scheduler: choice(SCHEDULERS, "front-end that places arrivals", "best-fit"),
  pinned: num("F", "share of each event's jobs pinned, drawn at random", { default: 0, min: 0, max: 1 }),
  unavailable: num("F", "share of each event's free hosts unavailable", { default: 0, min: 0, max: 1 }),
  json: bool("one JSON line per size and mix instead of tables"),
  "hard-limits": checked("LIST", "time limits (s) for the hard example's table; none skips it", positives, { default: "3,5,7,10,20,60" }),
  "unchanged-racks": checked("LIST", "racks of 8 hosts for the within-bounds table; none skips it", (raw, name) => positives(raw, name).map(Math.round), {
    default: "256,2048,8192",
  }),
};

const help = helpText({
  command: "npm run bench:plan --",
  table: FLAGS,
  about: "Generates cluster traces and plans every bound violation with our formulation and the paper's.",
});

interface Outcome {
  readonly status: Status;
  readonly moves: number;
  readonly ms: number;
  /** How the planner found its answer; `undefined` on a timeout. */
  readonly method: Plan["method"] | undefined;
  /** When the first valid plan was known, and its moves; absent without a plan. */
  readonly first?: { readonly ms: number; readonly moves: number };
  /** Proven lower bound on the moves. */
  readonly lowerBound: number;
}

interface Event {
  readonly ours: Outcome;
  readonly paper: Outcome;
}

interface Run {
  readonly mix: Mix;
  readonly gpus: number;
  readonly racks: number;
  readonly lambda: number;
  readonly events: readonly Event[];
  /** Time spent generating the trace, planner excluded. */
  readonly traceMs: number;
}

function options(argv: string[]) {
  const flags = parseCommandFlags(argv, FLAGS);
  const hostsPerRack = flags["hosts-per-rack"];
  const sizes = flags.sizes.split(",").map((raw) => {
    const gpus = Number(raw);
    if (!Number.isInteger(gpus) || gpus <= 0 || gpus % (hostsPerRack * GPUS_PER_HOST) !== 0) {
      throw new UsageError(`--sizes takes multiples of ${hostsPerRack * GPUS_PER_HOST} GPUs (racks of ${hostsPerRack}×${GPUS_PER_HOST}), got "${raw}"`);
    }
    if (gpus / GPUS_PER_HOST > MAX_HOSTS)
      throw new UsageError(`--sizes ${raw}: a cluster holds at most ${MAX_HOSTS} hosts (${MAX_HOSTS * GPUS_PER_HOST} GPUs)`);
    if (gpus / (hostsPerRack * GPUS_PER_HOST) > MAX_RACKS)
      throw new UsageError(`--sizes ${raw}: a cluster holds at most ${MAX_RACKS} racks; give more --hosts-per-rack`);
    return gpus;
  });
  return {
    sizes,
    hostsPerRack,
    mixes: flags.mix === "all" ? [...MIXES] : [flags.mix],
    events: flags.events,
    seed: flags.seed,
    timeLimitMs: flags["time-limit"],
    paperLimitMs: flags["paper-limit"] ?? flags["time-limit"],
    scheduler: flags.scheduler,
    pinned: flags.pinned,
    unavailable: flags.unavailable,
    json: flags.json,
    hardLimits: flags["hard-limits"],
    unchangedRacks: flags["unchanged-racks"],
  };
}

type Options = ReturnType<typeof options>;

function planOnce(planner: Planner, cluster: Cluster, formulation: Formulation, timeLimitMs: number): { outcome: Outcome; placement: Placement | undefined } {
  const start = performance.now();
  let first: Outcome["first"];
  const onProgress = (p: PlanProgress) => {
    if (first === undefined && p.best !== undefined) first = { ms: p.elapsedMs, moves: p.best };
  };
  try {
    const plan = planner.plan(cluster, { timeLimitMs, formulation, onProgress });
    // A plan settled in one phase reports no progress: the plan is its own first.
    if (first === undefined && (plan.status === "optimal" || plan.status === "feasible")) first = { ms: plan.solveMs, moves: plan.moveCount };
    const outcome = {
      status: plan.status,
      moves: plan.moveCount,
      ms: plan.solveMs,
      method: plan.method,
      lowerBound: plan.lowerBound,
      ...(first ? { first } : {}),
    };
    return { outcome, placement: plan.placement };
  } catch (error) {
    if (!(error instanceof PlanTimeoutError)) throw error;
    return { outcome: { status: "timeout", moves: 0, ms: performance.now() - start, method: undefined, lowerBound: error.lowerBound }, placement: undefined };
  }
}

/** The paper's formulation is the baseline where it runs at all; `--paper-limit 0` skips it. */
const SKIPPED: Outcome = { status: "skipped", moves: 0, ms: Number.NaN, method: undefined, lowerBound: 0 };

function runTrace(planner: Planner, mix: Mix, gpus: number, opts: Options): Run {
  const racks = gpus / (opts.hostsPerRack * GPUS_PER_HOST);
  const lambda = UPLINKS[mix];
  const topology = { racks, hostsPerRack: opts.hostsPerRack, gpusPerHost: GPUS_PER_HOST, uplinksPerRack: lambda };
  const events: Event[] = [];
  const generator = trace({ seed: opts.seed, topology, lambda, mix, events: opts.events, scheduler: opts.scheduler });
  let traceMs = 0;
  let lastProgress = performance.now();
  let started = performance.now();
  let step = generator.next();
  traceMs += performance.now() - started;
  while (!step.done) {
    const cluster =
      opts.pinned + opts.unavailable > 0
        ? constrain(step.value, { pinned: opts.pinned, unavailable: opts.unavailable, seed: opts.seed * 1000 + events.length })
        : step.value;
    // Alternate which formulation runs first so neither always gets the warmer caches.
    const order = events.length % 2 === 0 ? FORMULATIONS : ([...FORMULATIONS].reverse() as Formulation[]);
    const limit = (f: Formulation) => (f === "paper" ? opts.paperLimitMs : opts.timeLimitMs);
    const results = new Map(
      order.map((f) => [f, limit(f) > 0 ? planOnce(planner, cluster, f, limit(f)) : { outcome: SKIPPED, placement: undefined }] as const),
    );
    const ours = results.get("monkeytree");
    const paper = results.get("paper");
    if (!ours || !paper) throw new Error("internal: a formulation was not planned");
    events.push({ ours: ours.outcome, paper: paper.outcome });
    if (performance.now() - lastProgress > 5_000 || events.length === opts.events) {
      lastProgress = performance.now();
      process.stderr.write(`plan: ${mix} ${gpus} GPUs: ${events.length}/${opts.events} events\n`);
    }
    const reply = ours.outcome.status === "optimal" || ours.outcome.status === "feasible" ? ours.placement : undefined;
    started = performance.now();
    step = generator.next(reply);
    traceMs += performance.now() - started;
  }
  return { mix, gpus, racks, lambda, events, traceMs };
}

const planned = (o: Outcome) => o.status === "optimal" || o.status === "feasible";

/** Nearest-rank percentile of an ascending list. */
function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))] ?? Number.NaN;
}

function side(outcomes: readonly Outcome[]) {
  const ms = outcomes.flatMap((o) => (o.status === "skipped" ? [] : [o.ms])).sort((a, b) => a - b);
  const withPlan = outcomes.filter(planned);
  const firstMs = withPlan.flatMap((o) => (o.first ? [o.first.ms] : [])).sort((a, b) => a - b);
  const unproved = withPlan.filter((o) => o.status === "feasible");
  const moves = Object.fromEntries(
    MOVE_BUCKETS.map((bucket, i) => [bucket, withPlan.filter((o) => (i === MOVE_BUCKETS.length - 1 ? o.moves >= i + 1 : o.moves === i + 1)).length]),
  ) as Record<(typeof MOVE_BUCKETS)[number], number>;
  const statuses = Object.fromEntries(STATUSES.map((s) => [s, outcomes.filter((o) => o.status === s).length])) as Record<Status, number>;
  return {
    moves,
    meanMoves: withPlan.length ? withPlan.reduce((sum, o) => sum + o.moves, 0) / withPlan.length : Number.NaN,
    statuses,
    bySearch: outcomes.filter((o) => o.method === "search").length,
    byIlp: outcomes.filter((o) => o.method === "ilp").length,
    p50Ms: percentile(ms, 50),
    p90Ms: percentile(ms, 90),
    maxMs: ms.at(-1) ?? Number.NaN,
    firstP50Ms: percentile(firstMs, 50),
    firstP90Ms: percentile(firstMs, 90),
    firstMaxMs: firstMs.at(-1) ?? Number.NaN,
    /** How far the first plan's moves were from the final plan's, on average. */
    firstMovesRatio: mean(withPlan.flatMap((o) => (o.first && o.moves > 0 ? [o.first.moves / o.moves] : []))),
    unproved: unproved.length,
    /** The widest gap left between a plan and its proven lower bound. */
    worstGap: unproved.length ? Math.max(...unproved.map((o) => o.moves / Math.max(1, o.lowerBound))) : Number.NaN,
  };
}

function summarise(run: Run, opts: Options) {
  const ours = side(run.events.map((e) => e.ours));
  const paper = side(run.events.map((e) => e.paper));
  const both = run.events.filter((e) => planned(e.ours) && planned(e.paper));
  return {
    mix: run.mix,
    gpus: run.gpus,
    racks: run.racks,
    hostsPerRack: opts.hostsPerRack,
    lambda: run.lambda,
    seed: opts.seed,
    timeLimitMs: opts.timeLimitMs,
    instances: run.events.length,
    scheduler: opts.scheduler,
    pinned: opts.pinned,
    unavailable: opts.unavailable,
    traceMs: run.traceMs,
    /** The process's peak resident memory so far (sizes run smallest first, so this size's). */
    peakRssMb: process.resourceUsage().maxRSS / 1024,
    ours,
    paper,
    p50Ratio: paper.p50Ms / ours.p50Ms,
    p90Ratio: paper.p90Ms / ours.p90Ms,
    paperInfeasibleWhereOursPlanned: run.events.filter((e) => planned(e.ours) && e.paper.status === "infeasible").length,
    paperMoreMoves: both.filter((e) => e.paper.moves > e.ours.moves).length,
    paperFewerMoves: both.filter((e) => e.paper.moves < e.ours.moves).length,
  };
}

type Summary = ReturnType<typeof summarise>;

const ms = (value: number) => (Number.isNaN(value) ? "-" : value < 10 ? value.toFixed(2) : value.toFixed(0));
const fixed = (value: number) => (Number.isFinite(value) ? value.toFixed(2) : "-");
const mean = (values: readonly number[]) => (values.length ? values.reduce((a, b) => a + b, 0) / values.length : Number.NaN);
const ratio = (value: number) => (Number.isFinite(value) ? `${value.toFixed(2)}×` : "-");

function render(s: Summary): string {
  const rows: (string | number)[][] = [
    ...MOVE_BUCKETS.map((b) => [`moves ${b}`, s.ours.moves[b], s.paper.moves[b], ""]),
    ["mean moves", s.ours.meanMoves.toFixed(2), s.paper.meanMoves.toFixed(2), ratio(s.paper.meanMoves / s.ours.meanMoves)],
    ...STATUSES.map((st) => [st, s.ours.statuses[st], s.paper.statuses[st], ""]),
    ["by search", s.ours.bySearch, s.paper.bySearch, ""],
    ["by ILP", s.ours.byIlp, s.paper.byIlp, ""],
    ["solve p50 ms", ms(s.ours.p50Ms), ms(s.paper.p50Ms), ratio(s.p50Ratio)],
    ["solve p90 ms", ms(s.ours.p90Ms), ms(s.paper.p90Ms), ratio(s.p90Ratio)],
    ["solve max ms", ms(s.ours.maxMs), ms(s.paper.maxMs), ratio(s.paper.maxMs / s.ours.maxMs)],
    ["first plan p50 ms", ms(s.ours.firstP50Ms), ms(s.paper.firstP50Ms), ratio(s.paper.firstP50Ms / s.ours.firstP50Ms)],
    ["first plan p90 ms", ms(s.ours.firstP90Ms), ms(s.paper.firstP90Ms), ratio(s.paper.firstP90Ms / s.ours.firstP90Ms)],
    ["first plan max ms", ms(s.ours.firstMaxMs), ms(s.paper.firstMaxMs), ratio(s.paper.firstMaxMs / s.ours.firstMaxMs)],
    ["first ÷ final moves", fixed(s.ours.firstMovesRatio), fixed(s.paper.firstMovesRatio), ""],
    ["not proved optimal", s.ours.unproved, s.paper.unproved, ""],
    ["worst moves ÷ bound", fixed(s.ours.worstGap), fixed(s.paper.worstGap), ""],
  ];
  return [
    `${s.mix}, ${s.gpus.toLocaleString("en-US")} GPUs (${s.racks} racks × ${s.hostsPerRack} hosts × ${GPUS_PER_HOST} GPUs), ` +
      `λ = ${s.lambda}, ${s.instances} instances, seed ${s.seed}, time limit ${s.timeLimitMs / 1000} s, behind ${s.scheduler}` +
      (s.pinned + s.unavailable > 0 ? `, ${s.pinned} of jobs pinned, ${s.unavailable} of free hosts unavailable` : ""),
    table(["", "ours", "paper", "paper/ours"], rows),
    `paper infeasible where ours planned: ${s.paperInfeasibleWhereOursPlanned}/${s.instances}; ` +
      `paper needed more moves: ${s.paperMoreMoves}, fewer: ${s.paperFewerMoves}; ` +
      `trace generation ${ms(s.traceMs)} ms; peak memory ${s.peakRssMb.toFixed(0)} MB`,
  ].join("\n");
}

await benchMain("plan", help, options, async (opts) => {
  const planner = await createPlanner();
  for (const mix of opts.mixes) {
    for (const gpus of opts.sizes) {
      const summary = summarise(runTrace(planner, mix, gpus, opts), opts);
      process.stdout.write(opts.json ? `${JSON.stringify(summary)}\n` : `${render(summary)}\n\n`);
    }
  }
  if (opts.hardLimits.length > 0) process.stdout.write(`${anytimeTable(planner, opts.hardLimits)}\n\n`);
  if (opts.unchangedRacks.length > 0) process.stdout.write(`${unchangedTable(planner, opts.unchangedRacks)}\n`);
  return 0;
});
