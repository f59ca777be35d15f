// Simulator benchmark: the paper's §7 experiments as presets, every system on the same traces.
//
// Prints job slowdown per system and load with each system's p99 over MonkeyTree's, the
// defragmentation events (moves per event, the planner's time), and how long each system took
// to simulate against ECMP's time in the same run.
//
//   npm run bench:simulate -- --preset paper-1024 --loads 0.5,0.7,0.9,1
//   npm run bench:simulate -- --preset frag-1024 --tokens-per-replica 16384
//   npm run bench:simulate -- --preset paper-2048-16to1 --gpus-per-rack 64,128,256 --uplinks 4,8,16 --jobs 200
import { checked, choice, helpText, int, parseCommandFlags } from "../cli/flags.ts";
import { table, UsageError } from "../cli/io.ts";
import { MAX_HOSTS_PER_RACK, MAX_RACKS, MAX_UPLINKS_PER_RACK } from "../sdk/contract/protocol/limits.ts";
import { benchMain } from "./entry.ts";
import { defaultThreads, MAX_THREADS, runAll, type RunRequest } from "../cli/simulate/runs.ts";
import {
  bytesPerSecond,
  DEFAULT_TOKENS_PER_REPLICA,
  fabricSummary,
  generateJobs,
  idealRates,
  iterationSeconds,
  MAX_TOKENS_PER_REPLICA,
  PRESETS,
  presetConfig,
  presetGeneration,
  QUEUES,
  SCHEDULERS,
  systemReport,
  systemSpec,
  SYSTEMS,
  moveEvents,
  type Preset,
  type PresetName,
  type SystemName,
  type SystemReport,
  type PlanEvent,
  type SimJob,
} from "../controller/simulator/index.ts";

const presetNames = Object.keys(PRESETS) as PresetName[];

/** `--preset`'s name, once it names a preset this benchmark runs. */
function presetName(raw: string, name: string): PresetName {
  const preset: Preset | undefined = PRESETS[raw as PresetName];
  if (!preset) throw new UsageError(`--${name} must be one of ${presetNames.join(", ")}`);
  if (preset.variants) throw new UsageError(`--${name} ${raw} sweeps variants beside its loads; run it with monkeytree simulate`);
  return raw as PresetName;
}

function loadList(raw: string, name: string): number[] {
  const loads = raw.split(",").map(Number);
  if (loads.some((l) => !(l > 0 && l <= 1))) throw new UsageError(`--${name} must be numbers in (0, 1]`);
  return loads;
}

function systemList(raw: string): SystemName[] {
  const systems = raw.split(",") as SystemName[];
  for (const s of systems) if (!SYSTEMS.includes(s)) throw new UsageError(`unknown system ${s}`);
  return systems;
}

function counts(raw: string, name: string): number[] {
  const values = raw.split(",").map(Number);
  if (values.some((v) => !Number.isInteger(v) || v < 1)) throw new UsageError(`--${name} must be positive integers`);
  return values;
}

function uplinkCounts(raw: string, name: string): number[] {
  const uplinks = counts(raw, name);
  if (uplinks.some((u) => u > MAX_UPLINKS_PER_RACK)) throw new UsageError(`--${name}: at most ${MAX_UPLINKS_PER_RACK} per rack`);
  return uplinks;
}

const FLAGS = {
  preset: checked("NAME", `the preset to run: ${presetNames.join(" | ")}`, presetName, { default: "paper-1024" }),
  loads: checked("LIST", "offered loads (default: the preset's)", loadList),
  jobs: int("N", "jobs per trace (default: the preset's)", { min: 1 }),
  systems: checked("LIST", `systems to run, of ${SYSTEMS.join(", ")} (default: the preset's)`, systemList),
  seed: int("N", "trace seed", { default: 1, min: 0 }),
  scheduler: choice(SCHEDULERS, "front-end scheduler", "best-fit"),
  queue: choice(QUEUES, "queue discipline: fifo, the head blocks the queue; backfill starts any queued job that fits, reserving nothing", "fifo"),
  "tokens-per-replica": int("N", "local batch in tokens per model replica and iteration; prints each model's communication share of its jobs' ideal time", {
    default: DEFAULT_TOKENS_PER_REPLICA,
    min: 1,
    max: MAX_TOKENS_PER_REPLICA,
  }),
  "gpus-per-rack": checked(
    "LIST",
    "sweep instead (the §7.6 heatmap): the preset's GPUs regrouped into racks of each of these many GPUs, each with every --uplinks " +
      "count up to its GPUs (full bisection), at the first load; prints p99 and average slowdown per system, GPUs per rack against uplinks",
    counts,
  ),
  uplinks: checked("LIST", "uplinks per rack to sweep (default 16,32,64)", uplinkCounts),
  threads: int(
    "N",
    "runs of a load (or of a sweep's cells) side by side, each in a thread of its own (default: one per core, at most one per system); " +
      "the table of seconds gives the load's wall-clock time beside its runs' own times summed",
    { min: 1, max: MAX_THREADS },
  ),
};

const help = helpText({
  command: "npm run bench:simulate --",
  table: FLAGS,
  about: `Runs a simulator preset's systems on its generated traces and prints slowdowns, moves per
defragmentation event and simulation times.`,
});

function options(argv: string[]) {
  const flags = parseCommandFlags(argv, FLAGS);
  const preset: Preset = PRESETS[flags.preset];
  const systems = flags.systems ?? [...preset.systems];
  const gpusPerRack = flags["gpus-per-rack"];
  if (flags.uplinks !== undefined && !gpusPerRack) throw new UsageError("--uplinks sweeps with --gpus-per-rack");
  const gpus = preset.fabric.racks * preset.fabric.hostsPerRack * preset.fabric.gpusPerHost;
  for (const g of gpusPerRack ?? []) {
    const hosts = g / preset.fabric.gpusPerHost;
    if (!Number.isInteger(hosts) || gpus % g !== 0 || hosts > MAX_HOSTS_PER_RACK || gpus / g > MAX_RACKS) {
      throw new UsageError(
        `--gpus-per-rack ${g}: racks must hold whole hosts of ${preset.fabric.gpusPerHost} GPUs (at most ${MAX_HOSTS_PER_RACK}) and divide the ${gpus} GPUs into at most ${MAX_RACKS} racks`,
      );
    }
  }
  return {
    sweep: gpusPerRack ? { gpusPerRack, uplinks: flags.uplinks ?? [16, 32, 64] } : undefined,
    scheduler: flags.scheduler,
    queue: flags.queue,
    name: flags.preset,
    preset,
    loads: flags.loads ?? [...preset.loads],
    systems,
    jobs: flags.jobs ?? preset.jobs,
    seed: flags.seed,
    threads: flags.threads ?? defaultThreads(systems.length),
    tokensPerReplica: flags["tokens-per-replica"],
  };
}

type Options = ReturnType<typeof options>;

interface Cell {
  readonly report: SystemReport;
  readonly plans: readonly PlanEvent[];
  readonly seconds: number;
}

/** The runs' configuration: the preset's, with the flags' seed, front-end and queue. */
const runConfig = (o: Options) => ({ ...presetConfig(o.preset), seed: o.seed, scheduler: o.scheduler, queue: o.queue });

/** The preset's trace at `load`, drawn for all of its hosts. */
function presetTrace(o: Options, load: number): SimJob[] {
  const { fabric } = o.preset;
  const generate = {
    ...presetGeneration(o.preset),
    seed: o.seed,
    hostCount: fabric.racks * fabric.hostsPerRack,
    load,
    jobs: o.jobs,
    gpusPerHost: fabric.gpusPerHost,
    tokensPerReplica: o.tokensPerReplica,
  };
  return generateJobs(generate, bytesPerSecond(fabric.nicGbps));
}

/** The §7.6 heatmap: one trace, the preset's GPUs in racks of each size, with each uplink count. */
async function sweep(o: Options, grid: { gpusPerRack: number[]; uplinks: number[] }): Promise<number> {
  const { preset } = o;
  const gpn = preset.fabric.gpusPerHost;
  const gpus = preset.fabric.racks * preset.fabric.hostsPerRack * gpn;
  const load = o.loads[0]!;
  const jobs = presetTrace(o, load);
  const columns = (g: number) => grid.uplinks.filter((u) => u <= g);
  const cellKeys = grid.gpusPerRack.flatMap((g) => columns(g).flatMap((u) => o.systems.map((system) => ({ system, g, u }))));
  const config = runConfig(o);
  const requests: RunRequest[] = cellKeys.map(({ system, g, u }, index) => ({
    index,
    system,
    variant: null,
    load,
    config: { ...config, fabric: { racks: gpus / g, hostsPerRack: g / gpn, gpusPerHost: gpn, uplinksPerRack: u, nicGbps: preset.fabric.nicGbps } },
    jobs,
    samples: false,
  }));
  const cells = new Map<string, SystemReport>();
  const started = performance.now();
  await runAll(requests, o.threads, {
    progress: () => undefined,
    finished: ({ index, run, seconds }) => {
      const { system, g, u } = cellKeys[index]!;
      cells.set(`${system}/${g}/${u}`, systemReport(run, load));
      process.stderr.write(`${system}, ${g} GPUs and ${u} uplinks per rack: ${seconds.toFixed(1)} s\n`);
    },
  });
  process.stdout.write(
    `${o.name} swept: ${gpus} GPUs, ${preset.mix} mix, ${o.jobs} jobs at ${Math.round(load * 100)}% load, ${o.tokensPerReplica} tokens per replica, seed ${o.seed}, ${o.scheduler}, ${o.queue} queue; λ = uplinks per rack\n\n`,
  );
  for (const [title, pick] of [
    ["p99 slowdown", (r: SystemReport) => r.slowdown.p99],
    ["average slowdown", (r: SystemReport) => r.slowdown.avg],
  ] as const) {
    const rows = o.systems.flatMap((system) =>
      grid.gpusPerRack.map((g) => [system, String(g), ...grid.uplinks.map((u) => (u <= g ? pick(cells.get(`${system}/${g}/${u}`)!).toFixed(3) : "-"))]),
    );
    process.stdout.write(`${title} (columns: uplinks per rack)\n${table(["system", "GPUs/rack", ...grid.uplinks.map(String)], rows)}\n\n`);
  }
  process.stdout.write(`${cells.size} runs in ${((performance.now() - started) / 1000).toFixed(1)} s\n`);
  return 0;
}

async function run(o: Options): Promise<number> {
  if (o.sweep) return sweep(o, o.sweep);
  const runs = await runLoads(o);
  process.stdout.write(heading(o));
  process.stdout.write(`${communicationTable(runs.traces.flat(), o.preset.fabric)}\n\n`);
  process.stdout.write(slowdownTable(o, runs, "p99 slowdown (JCT ÷ ideal JCT)", (r) => r.slowdown.p99));
  process.stdout.write(slowdownTable(o, runs, "average slowdown", (r) => r.slowdown.avg));
  const migrating = o.systems.filter((s) => systemSpec(s).migrate);
  if (migrating.length) process.stdout.write(defragmentationTable(o, runs, migrating));
  process.stdout.write(fragmentationTable(o, runs));
  process.stdout.write(simulationTimeTable(o, runs));
  process.stdout.write(loadTimeTable(o, runs));
  return 0;
}

/** Every system's run at every load, the loads' traces, and each load's wall-clock seconds with its runs side by side on `o.threads` threads. */
interface LoadRuns {
  readonly cells: ReadonlyMap<string, Cell>;
  readonly traces: readonly SimJob[][];
  readonly walls: ReadonlyMap<number, number>;
}

const cellKey = (system: string, load: number) => `${system}@${load}`;
const cellAt = (runs: LoadRuns, system: string, load: number): Cell => runs.cells.get(cellKey(system, load))!;
const pct = (load: number) => `${Math.round(load * 100)}%`;

/** Runs every system on each load's trace, a load at a time, saying on stderr how long each run took. */
async function runLoads(o: Options): Promise<LoadRuns> {
  const config = runConfig(o);
  const cells = new Map<string, Cell>();
  const traces: SimJob[][] = [];
  const walls = new Map<number, number>();
  for (const load of o.loads) {
    const jobs = presetTrace(o, load);
    traces.push(jobs);
    const requests = o.systems.map((system, index) => ({ index, system, variant: null, load, config, jobs, samples: false }));
    const started = performance.now();
    await runAll(requests, o.threads, {
      progress: () => undefined,
      finished: ({ index, run, seconds }) => {
        const system = o.systems[index]!;
        cells.set(cellKey(system, load), { report: systemReport(run, load), plans: run.plans, seconds });
        process.stderr.write(`${system} at load ${load}: ${seconds.toFixed(1)} s\n`);
      },
    });
    walls.set(load, (performance.now() - started) / 1000);
  }
  return { cells, traces, walls };
}

/** The preset's fabric and the traces' settings. */
function heading(o: Options): string {
  const f = o.preset.fabric;
  const lambda = o.preset.lambda ?? f.uplinksPerRack;
  return (
    `${o.name}: ${f.racks * f.hostsPerRack * f.gpusPerHost} GPUs (${f.racks} racks × ${f.hostsPerRack} hosts × ${f.gpusPerHost}), ` +
    `${f.uplinksPerRack} uplinks per rack (${(f.hostsPerRack * f.gpusPerHost) / f.uplinksPerRack}:1)${fabricSummary(f)}, λ = ${lambda}, ${o.preset.mix} mix, ${o.jobs} jobs per load, ${o.tokensPerReplica} tokens per replica, seed ${o.seed}, ${o.scheduler}, ${o.queue} queue\n\n`
  );
}

/** A slowdown per system and load, and each system's at the last load over MonkeyTree's. */
function slowdownTable(o: Options, runs: LoadRuns, title: string, pick: (r: SystemReport) => number): string {
  const last = o.loads[o.loads.length - 1]!;
  const base = o.systems.includes("monkeytree") ? cellAt(runs, "monkeytree", last).report : undefined;
  const rows = o.systems.map((s) => [
    s,
    ...o.loads.map((l) => pick(cellAt(runs, s, l).report).toFixed(3)),
    base ? (pick(cellAt(runs, s, last).report) / pick(base)).toFixed(2) : "-",
  ]);
  return `${title}\n${table(["system", ...o.loads.map(pct), `÷ monkeytree at ${pct(last)}`], rows)}\n\n`;
}

/** The migrating systems' plans that moved workers: how many, how many moves each, and the planner's time. */
function defragmentationTable(o: Options, runs: LoadRuns, migrating: readonly SystemName[]): string {
  const rows = migrating.flatMap((s) =>
    o.loads.map((l) => {
      const { report, plans } = cellAt(runs, s, l);
      const events = moveEvents(plans);
      const histogram = Object.entries(events.moves.histogram)
        .sort(([a], [b]) => Number(a) - Number(b))
        .map(([moves, n]) => `${moves}:${n}`)
        .join(" ");
      return [
        s,
        pct(l),
        events.count,
        events.count ? events.moves.avg.toFixed(2) : "-",
        events.count ? `${Math.round(events.moves.shareOneOrTwo * 100)}%` : "-",
        histogram || "-",
        report.migrationsPerJob.max,
        report.solver.p50Ms.toFixed(1),
        report.solver.p99Ms.toFixed(1),
      ];
    }),
  );
  return `defragmentation events (plans that moved workers)\n${table(["system", "load", "events", "moves/event", "1-2 moves", "histogram (moves:events)", "most moves of a job", "solve p50 ms", "p99 ms"], rows)}\n\n`;
}

/** Each run's fragmentation over time and makespan, beside MonkeyTree's at the same load. */
function fragmentationTable(o: Options, runs: LoadRuns): string {
  const rows = o.systems.flatMap((s) =>
    o.loads.map((l) => {
      const { report } = cellAt(runs, s, l);
      const base = o.systems.includes("monkeytree") ? cellAt(runs, "monkeytree", l).report : undefined;
      const f = report.fragmentation;
      return [
        s,
        pct(l),
        f.meanTotal.toFixed(1),
        base ? (f.meanTotal / Math.max(1e-9, base.fragmentation.meanTotal)).toFixed(2) : "-",
        f.peakTotal,
        f.meanMaxRack.toFixed(2),
        f.peakMaxRack,
        f.meanFragmentedGroups.toFixed(1),
        (report.makespanSeconds / 3600).toFixed(1),
        base ? (report.makespanSeconds / base.makespanSeconds).toFixed(2) : "-",
      ];
    }),
  );
  return `fragmentation over time (total: rings per rack summed over racks; time averages over the makespan)
${table(
  ["system", "load", "mean total", "÷ monkeytree", "peak total", "mean max rack", "peak max rack", "fragmented groups", "makespan h", "÷ monkeytree"],
  rows,
)}

`;
}

/** Each system's seconds over all loads, against ECMP's. */
function simulationTimeTable(o: Options, runs: LoadRuns): string {
  const total = (s: SystemName) => o.loads.reduce((sum, l) => sum + cellAt(runs, s, l).seconds, 0);
  const baseline = o.systems.includes("ecmp") ? total("ecmp") : undefined;
  const rows = o.systems.map((s) => [s, total(s).toFixed(1), baseline ? (total(s) / baseline).toFixed(2) : "-"]);
  return `simulation time over all loads (${o.jobs} jobs each)\n${table(["system", "seconds", "÷ ecmp"], rows)}\n\n`;
}

/** Each load's wall-clock seconds beside its runs' own, and the planner's share of them. */
function loadTimeTable(o: Options, runs: LoadRuns): string {
  // The planner's solves, timed inside the same runs: what a faster simulator could not save.
  const rows = o.loads.map((l) => {
    const cells = o.systems.map((s) => cellAt(runs, s, l));
    const seconds = cells.reduce((sum, c) => sum + c.seconds, 0);
    const planning = cells.reduce((sum, c) => sum + c.report.solver.totalMs, 0) / 1000;
    return [pct(l), runs.walls.get(l)!.toFixed(1), seconds.toFixed(1), planning.toFixed(1), `${Math.round((100 * planning) / seconds)}%`];
  });
  const header = ["load", `seconds (${o.threads} thread${o.threads > 1 ? "s" : ""})`, "runs' seconds, summed", "planning s", "planning share"];
  return `seconds per load, every system (${o.jobs} jobs)\n${table(header, rows)}\n`;
}

/**
 * Per model, how much of its jobs' ideal time (every iteration at full NIC rate, summed over
 * the traces' jobs) is communication rather than compute: the most congestion can slow them.
 */
function communicationTable(jobs: readonly SimJob[], fabric: { nicGbps: number; gpusPerHost: number }): string {
  const nic = bytesPerSecond(fabric.nicGbps);
  const byModel = new Map<string, { jobs: number; iterations: number; compute: number; total: number }>();
  for (const job of jobs) {
    const ideal = iterationSeconds(job, idealRates(nic, fabric.gpusPerHost));
    const m = byModel.get(job.model ?? "-") ?? { jobs: 0, iterations: 0, compute: 0, total: 0 };
    m.jobs++;
    m.iterations += job.iterations;
    m.compute += job.iterations * job.computeSeconds;
    m.total += job.iterations * ideal;
    byModel.set(job.model ?? "-", m);
  }
  const all = [...byModel.values()].reduce((a, m) => ({ compute: a.compute + m.compute, total: a.total + m.total }), { compute: 0, total: 0 });
  const share = (m: { compute: number; total: number }) => `${(100 * (1 - m.compute / m.total)).toFixed(1)}%`;
  const rows = [...byModel]
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([model, m]) => [model, m.jobs, (m.compute / m.iterations).toFixed(2), (m.total / m.iterations).toFixed(2), share(m)]);
  rows.push(["all", jobs.length, "-", "-", share(all)]);
  return `communication share of ideal job time (iterations at full NIC rate)\n${table(["model", "jobs", "compute s/iteration", "ideal s/iteration", "communication"], rows)}`;
}

await benchMain("simulate", help, options, run);
