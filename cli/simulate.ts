import { appendFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { InvalidInputError } from "../sdk/contract/errors.ts";
import { MAX_GPUS_PER_HOST, MAX_HOSTS, MAX_HOSTS_PER_RACK, MAX_RACKS, MAX_UPLINKS_PER_RACK } from "../sdk/contract/protocol/limits.ts";
import {
  bytesPerSecond,
  DEFAULT_TOKENS_PER_REPLICA,
  fabricSummary,
  FREE_PLAN_TIME_LIMIT_MS,
  generateJobs,
  MAX_TOKENS_PER_REPLICA,
  MIXES,
  SIM_MIXES,
  MODELS,
  MAX_TRACE_JOBS,
  parseSimJobs,
  tooManyJobs,
  sacctToTrace,
  PRESETS,
  applyVariant,
  presetConfig,
  presetGeneration,
  isPublishedMix,
  sweptSettings,
  QUEUES,
  SCHEDULERS,
  simulationReport,
  systemReport,
  SYSTEMS,
  type FabricShape,
  type Preset,
  type SimMix,
  type PresetName,
  type SimConfigInput,
  type SimJob,
  type SystemName,
  type SimulationReport,
  type SystemReport,
  type SystemRun,
  type TraceGeneration,
  type Variant,
} from "../controller/simulator/index.ts";
import { mergeReports } from "./simulate/merge.ts";
import { submitArray } from "./simulate/slurm-array.ts";
import { figures, reportPage, type FragmentationSeries } from "./simulate/page.ts";
import { restartFromBench } from "./simulate/restart.ts";
import { headlineTable } from "./simulate/headlines.ts";
import { Progress } from "./simulate/progress.ts";
import { defaultThreads, MAX_THREADS, runAll, type CsvLines, type RunRequest } from "./simulate/runs.ts";
import { bool, checked, choice, helpText, int, parseCommandFlags, str, type FlagValues } from "./flags.ts";
import { ExitCode, numberFlag, readInputFile, secondsFlag, table, UsageError, writeJson, type Command, type Io } from "./io.ts";
import { outputDir } from "./output.ts";
import { DEFAULT_PLAN_TIME_LIMIT_MS } from "../controller/service/plan-thread.ts";

const presetNames = Object.keys(PRESETS) as PresetName[];
/**
 * Bounds far past any fabric (100 Tb/s NICs) and any expert-parallel model (the paper's 10),
 * below where rates and byte counts stop being finite numbers and the simulation stalls.
 */
const MAX_NIC_GBPS = 100_000;
const MAX_EP_FACTOR = 1_000;
/** A trace file larger than this is refused: `MAX_TRACE_JOBS` jobs' lines fit easily. */
const MAX_TRACE_BYTES = 256 * 1024 * 1024;
/** A report of the largest preset (fig-oversubscription: 60 runs) is about 100 KiB. */
const MAX_REPORT_BYTES = 16 * 1024 * 1024;

/** A check that the value is one of `values`, for flags whose names are too many (or too pinned) for `choice`'s A|B spelling. */
const named =
  <V extends string>(values: readonly V[]) =>
  (value: string, name: string): V => {
    const found = values.find((v) => v === value);
    if (found === undefined) throw new UsageError(`--${name} must be one of ${values.join(", ")}, got "${value}"`);
    return found;
  };

/** A number from `min` (to `max`) whose default the preset or another flag gives, so an absent flag stays undefined. */
const number =
  (min: number, max?: number) =>
  (value: string, name: string): number =>
    numberFlag(name, value, 0, min, max);

/** A comma-separated list, each item checked by `parse`. */
const listOf =
  <T>(parse: (item: string) => T) =>
  (value: string, name: string): T[] =>
    listFlag(name, value, [], parse);

const system = (name: string): SystemName => {
  if (!(SYSTEMS as readonly string[]).includes(name)) throw new UsageError(`--systems: unknown system "${name}"; choose from ${SYSTEMS.join(", ")}`);
  return name as SystemName;
};

const load = (item: string): number => {
  const value = Number(item);
  if (!(value > 0 && value <= 1)) throw new UsageError(`--loads: each load must be a number in (0, 1], got "${item}"`);
  return value;
};

/**
 * Flags whose defaults are the preset's stay undefined when absent: a replayed trace or a
 * preset's variants refuse them only when given. Output directories stay text, made once
 * every flag is checked, so a refused combination leaves no directory behind.
 */
const FLAGS = {
  preset: checked(
    "NAME",
    `the fabric, λ, job mix, loads, job count and systems of an experiment (docs/simulator.md; fig-*: docs/paper-evaluation.md): one of ${presetNames.join(", ")}`,
    named(presetNames),
    { default: "small" },
  ),
  trace: str(
    "FILE",
    "replay jobs from a JSON-lines file instead of generating them (one job per line; docs/simulator.md); runs on the preset's fabric unless given one",
  ),
  "from-sacct": str(
    "FILE",
    "replay your cluster's history: the output of `sacct --json` (Slurm 22.05 or later), converted to a trace: arrival = submit time, " +
      "DP degree = allocated nodes (each must hold --gpus-per-host GPUs of gres/gpu), elapsed time = iterations of the model named by " +
      "`sbatch --comment monkeytree:model=NAME` (or --model); jobs that never ran or held no GPU are skipped. " +
      "With --save-trace DIR, also writes DIR/trace-sacct.jsonl",
  ),
  model: str("NAME", `with --from-sacct, the model of jobs whose comment names none (${Object.keys(MODELS).join(", ")})`),
  systems: checked("LIST", `comma-separated (default: the preset's), from ${SYSTEMS.join(", ")}`, listOf(system)),
  loads: checked("LIST", "offered loads in (0, 1], comma-separated (default: the preset's)", listOf(load)),
  variants: str(
    "LIST",
    "of a preset that sweeps something beside the load (a fig-* preset's λ, front-ends or fabrics; see its description), " +
      "the variants to run, by name (default: all); the flags of what it sweeps are then its own",
  ),
  jobs: int("N", "jobs per generated trace (default: the preset's)", { min: 1, max: MAX_TRACE_JOBS }),
  racks: int(
    "N",
    "racks of your own 2-tier fabric (default: the preset's, as for the fabric flags below; a 3-tier or rail preset keeps its racks per pod, core links or rails)",
    {
      min: 1,
      max: MAX_RACKS,
    },
  ),
  "hosts-per-rack": int("N", "hosts per rack (default: the preset's)", { min: 1, max: MAX_HOSTS_PER_RACK }),
  "gpus-per-host": int("N", "GPUs (and NICs) per host (default: the preset's)", { min: 1, max: MAX_GPUS_PER_HOST }),
  uplinks: int("N", "uplinks per rack, one per spine (default: the preset's)", { min: 1, max: MAX_UPLINKS_PER_RACK }),
  "nic-gbps": checked("G", "link speed in Gb/s (default: the preset's)", number(0.001, MAX_NIC_GBPS)),
  mix: checked(
    "NAME",
    `job mix of generated traces (default: the preset's): ${MIXES.join(" or ")}, drawn from the paper's model table in hosts and hours, ` +
      "or paper, the ten job types the paper's authors published (16-64 GPUs, 100-1,000 iterations each), " +
      "or its DP and FSDP types alone (paper-dp), or its EP figure's models (paper-ep)",
    named(SIM_MIXES),
  ),
  "mean-hours": checked("H", "mean ideal job duration of generated traces (default: the preset's)", number(0.001)),
  "ep-factor": checked(
    "X",
    "expert-parallel all-to-all bytes per host as a multiple of its DP ring bytes (paper §7.10: 10; default: the preset's, else 0); experimental, docs/simulator.md",
    number(0, MAX_EP_FACTOR),
  ),
  "tokens-per-replica": int(
    "N",
    "local batch of generated traces in tokens per model replica and iteration (a DP/FSDP replica is one GPU, a TP job's spans its TP × PP GPUs): " +
      `scales compute, so how communication-bound jobs are (default ${DEFAULT_TOKENS_PER_REPLICA}, 16 × 4,096; 1 to ${MAX_TOKENS_PER_REPLICA}); docs/simulator.md`,
    { min: 1, max: MAX_TOKENS_PER_REPLICA },
  ),
  seed: int("N", "seeds the traces, ECMP source ports, SGLB and the random scheduler", { default: 1, min: 0, max: 2 ** 31 - 1 }),
  scheduler: choice(SCHEDULERS, "front-end scheduler (default best-fit)"),
  queue: checked(
    "NAME",
    "queue discipline: fifo, where the queue's head waits for room and everyone behind it waits too, " +
      "or backfill, which starts any queued job the front-end can place now, reserving nothing for the jobs it passes",
    named(QUEUES),
    { default: "fifo" },
  ),
  "queue-in-moves": choice(
    ["place", "hold"],
    "whether queued jobs start while a migration's jobs stop and move their state (place), or wait until the moves are done " +
      "(hold, as the paper's simulator does; the fig-* presets' setting); default: the preset's, else place",
  ),
  "migrate-by": choice(
    ["plan", "job"],
    "whether a plan's jobs stop, move and restart together, as the controller moves a plan step (plan), or each on its own: " +
      "its transfers start once it and the jobs it displaces have stopped, and it restarts once its own state arrived " +
      "(job, as the paper's simulator moves them; the fig-* presets' setting); default: the preset's, else plan",
  ),
  "plan-time": choice(
    ["free", "solve"],
    "what planning costs in simulated time: nothing (free, as the paper's simulator charges it), or the planner's own solve time " +
      "(solve, as the controller plans), during which the cluster runs on and after which a plan for a cluster that changed meanwhile " +
      "is dropped and the cluster planned again; its results then depend on this machine's speed",
    "free",
  ),
  "plan-time-limit": checked(
    "S",
    `the planner's time per event (default: with --plan-time solve the controller's, ${DEFAULT_PLAN_TIME_LIMIT_MS / 1000} s; ` +
      `else ${FREE_PLAN_TIME_LIMIT_MS / 1000} s, where the planner's work caps end a plan first, so that a replay takes the same path on any machine)`,
    (value, name) => secondsFlag(name, value, 0, 0.001),
  ),
  lambda: int("N", "MonkeyTree's per-rack bound (default: the preset's, else the uplinks per rack)", { min: 0 }),
  restart: checked("SEC", "restart cost of a migration after its transfers (default 10)", number(0)),
  "restart-from": str(
    "FILE",
    "the restart cost measured here: `npm run bench:migrate -- --json`'s document, whose largest overhead " +
      "(a move's downtime beyond its bytes' own time, which the simulator charges as transfers) it takes",
  ),
  json: bool("print one JSON document (schema: SimulationReportSchema) instead of tables"),
  csv: str("DIR", "write jobs.csv, plans.csv, fragmentation.csv and summary.csv, system by system"),
  plot: str(
    "DIR",
    "write each chart of --report's page as an SVG file: slowdown-p99.svg and slowdown-avg.svg (against load, or per variant), " +
      "fragmentation-LOAD.svg and fragmentation-total-LOAD.svg (over time), moves.svg (moves per event)",
  ),
  report: str(
    "DIR",
    "write DIR/index.html: the paper's headline numbers beside this run's (for a fig-* preset), " +
      "the figures (a chart per variant) and every run's numbers, one page that any browser opens",
  ),
  "save-trace": str(
    "DIR",
    "write each generated (or converted) trace as DIR/trace-LOAD.jsonl (trace-sacct.jsonl), replayable with --trace; " +
      "generated ones with DIR/generation.json, the options that drew them",
  ),
  threads: int(
    "N",
    "runs (a system on a load and variant) side by side, each in a thread of its own; the results are the same for any N " +
      "(default: one per core, at most one per run and one per 2 GiB of memory; with --plan-time solve, 1, " +
      "since runs side by side would slow each other's planner down and so change what they charge)",
    { min: 1, max: MAX_THREADS },
  ),
  "slurm-array": str(
    "DIR",
    "run the sweep on Slurm: one job array task per variant and load (each a simulate of its own, its JSON report in DIR/part-K.json, " +
      "its log in DIR/task-K.log), then a job that merges them once all succeeded into DIR/merged.json and DIR/report/index.html. " +
      "Submits both with sbatch and prints their ids; DIR/array.sh stays for a resubmission",
  ),
  sbatch: str("ARGS", "more sbatch options for both jobs, space-separated, such as `--partition=cpu --time=4:00:00`"),
  merge: checked(
    "FILES",
    "comma-separated JSON reports (`--json`'s) of one preset's runs, made apart: one per seed, or the parts of a sweep split by variant or load. " +
      "Prints one report per seed and the paper's numbers beside their mean and range (--json: the reports' list); " +
      "--report's page gives the same numbers, and charts the seeds' mean",
    listOf((path) => path),
  ),
};

const help = helpText({
  command: "monkeytree simulate",
  table: FLAGS,
  about: `What-if simulation of a shared GPU cluster: a Poisson trace of jobs from the paper's model
table (or your own history) runs on a flow-level, max-min fair fabric (a 2-tier Clos; the
paper-3tier and paper-rail presets: a 3-tier Clos, rail-optimised), once per system:
routing alone (ECMP, Crux, SGLB, Perfect), MonkeyTree's planner and migrations in front of a
routing, and packet spraying on a full-bisection fabric as the ideal. Prints, per system and
load, job slowdown (completion time ÷ ideal), makespan, migrations and planner effort, and
for a fig-* preset the paper's headline numbers beside this run's.`,
  after: `to run a preset's sweep on Slurm, or merge the reports of runs made apart:
       monkeytree simulate --preset NAME [run flags] --slurm-array DIR [--sbatch ARGS]
       monkeytree simulate --merge FILES [--report DIR] [--plot DIR] [--json]

Progress goes to stderr. exit codes: 0 done, 2 bad usage or input, 3 internal error`,
});

export const command: Command = {
  summary: "simulate a cluster trace with and without MonkeyTree, comparing job slowdowns",
  help,
  async run(argv, io) {
    const flags = parseCommandFlags(argv, FLAGS);
    if (flags.merge !== undefined) return merge(argv, flags.merge, flags, io);
    const scenario = scenarioFlags(flags);
    if (flags["slurm-array"] !== undefined) return submitSweep(argv, flags["slurm-array"], flags, scenario, io);
    const settings = variantSettings(scenario.config, scenario.variants);
    const { traces, generation } = await chooseTraces(flags, scenario, settings, io);
    const charted = flags.plot !== undefined || flags.report !== undefined;
    const requests = runRequests(settings, traces, scenario.systems, charted);
    const threads = scenario.threads ?? (scenario.config.planTime === "solve" ? 1 : defaultThreads(requests.length));
    const { runs, fragmentation } = await runWithProgress(requests, threads, flags.csv, charted, io);
    const report = simulationReport(scenario.config, runs, generation, {
      preset: scenario.presetName,
      variants: scenario.variants.flatMap((v) => (v === null ? [] : [v])),
    });
    await writeCharts(flags, [report], fragmentation);
    if (flags.json) await writeJson(io, report);
    else io.out.write(`${render(report.systems, scenario.config)}${paperBeside([report])}\n`);
    return ExitCode.ok;
  },
};

type SimulateFlags = FlagValues<typeof FLAGS>;

/** How generated traces are drawn, beside the preset's generation, the job count and the seed. */
interface Drawing {
  readonly mix: SimMix;
  readonly meanHours: number;
  readonly epFactor: number;
  readonly tokensPerReplica: number;
}

/** What a run of the simulator runs, as its flags and preset give it. */
interface Scenario {
  readonly presetName: PresetName;
  readonly preset: Preset;
  readonly systems: SystemName[];
  readonly variants: (Variant | null)[];
  /** `--threads`, where given. */
  readonly threads: number | undefined;
  /** The file that gives the jobs (`--trace` or `--from-sacct`), where one does. */
  readonly replayed: string | undefined;
  /** `config`'s seed and fabric, whose defaults its input type leaves optional: traces are drawn for them. */
  readonly seed: number;
  readonly fabric: FabricShape;
  readonly drawing: Drawing;
  /** Every variant's configuration before the variant changes it. */
  readonly config: SimConfigInput;
}

/** The scenario the flags ask for, its flags checked and its output directories made ready before any trace is read or drawn. */
function scenarioFlags(flags: SimulateFlags): Scenario {
  const presetName = flags.preset;
  const preset: Preset = PRESETS[presetName];
  const systems = flags.systems ?? [...preset.systems];
  const variants = chooseVariants(presetName, preset, flags);
  const scheduling = schedulingFlags(flags, preset);
  const threads = flags.threads;
  const replayed = replayedFile(flags);
  const seed = flags.seed;
  const lambda = flags.lambda ?? preset.lambda;
  const fabric = fabricFlags(flags, preset);
  const drawing = drawingFlags(flags, preset);
  for (const flag of ["csv", "plot", "report", "save-trace"] as const) {
    const dir = flags[flag];
    if (dir !== undefined) outputDir(flag, dir);
  }
  const config: SimConfigInput = {
    ...presetConfig(preset),
    fabric,
    ...(lambda === undefined ? {} : { lambda }),
    ...scheduling,
    seed,
    restartSeconds: restartSeconds(flags.restart, flags["restart-from"]),
  };
  return { presetName, preset, systems, variants, threads, replayed, seed, fabric, drawing, config };
}

/** The front-end, its queue, how migrations run and what planning costs: the flags', else the preset's or the defaults. */
function schedulingFlags(
  flags: SimulateFlags,
  preset: Preset,
): Pick<SimConfigInput, "scheduler" | "queue" | "queueInMoves" | "migrateBy" | "planTime" | "planTimeLimitMs"> {
  const planTime = flags["plan-time"];
  const planTimeLimitMs = flags["plan-time-limit"] ?? (planTime === "solve" ? DEFAULT_PLAN_TIME_LIMIT_MS : FREE_PLAN_TIME_LIMIT_MS);
  return {
    scheduler: flags.scheduler ?? "best-fit",
    queue: flags.queue,
    queueInMoves: flags["queue-in-moves"] ?? preset.queueInMoves ?? "place",
    migrateBy: flags["migrate-by"] ?? preset.migrateBy ?? "plan",
    planTime,
    planTimeLimitMs: Math.round(planTimeLimitMs),
  };
}

/** The file `--trace` or `--from-sacct` names, where one does: its jobs replace generated traces, so no flag that shapes those may come with it. */
function replayedFile(flags: SimulateFlags): string | undefined {
  if (flags.trace !== undefined && flags["from-sacct"] !== undefined) throw new UsageError("--trace and --from-sacct both give the jobs; pass one");
  const replayed = flags.trace ?? flags["from-sacct"];
  const generatorFlags = [
    "loads",
    "jobs",
    "mix",
    "mean-hours",
    "ep-factor",
    "tokens-per-replica",
    ...(flags.trace === undefined ? [] : (["save-trace"] as const)),
  ] as const;
  if (replayed !== undefined && generatorFlags.some((f) => flags[f] !== undefined)) {
    throw new UsageError(
      `--${generatorFlags.join(", --")} shape generated traces; with --${flags.trace === undefined ? "from-sacct" : "trace"} the file gives the jobs`,
    );
  }
  if (flags.model !== undefined && flags["from-sacct"] === undefined) throw new UsageError("--model names the model of jobs read with --from-sacct");
  return replayed;
}

/** The preset's fabric with the flags' racks, hosts, GPUs, uplinks and link speed, at most `MAX_HOSTS` hosts. */
function fabricFlags(flags: SimulateFlags, preset: Preset): FabricShape {
  const fabric = {
    ...preset.fabric,
    racks: flags.racks ?? preset.fabric.racks,
    hostsPerRack: flags["hosts-per-rack"] ?? preset.fabric.hostsPerRack,
    gpusPerHost: flags["gpus-per-host"] ?? preset.fabric.gpusPerHost,
    uplinksPerRack: flags.uplinks ?? preset.fabric.uplinksPerRack,
    nicGbps: flags["nic-gbps"] ?? preset.fabric.nicGbps,
  };
  if (fabric.racks * fabric.hostsPerRack > MAX_HOSTS) {
    throw new UsageError(
      `--racks × --hosts-per-rack (${fabric.racks} × ${fabric.hostsPerRack}) must be at most ${MAX_HOSTS} hosts, the largest cluster the planner supports`,
    );
  }
  return fabric;
}

/** The mix of generated traces and, for a mix drawn from the model table, its jobs' durations and costs. */
function drawingFlags(flags: SimulateFlags, preset: Preset): Drawing {
  const mix = flags.mix ?? preset.mix;
  const costFlags = (["mean-hours", "ep-factor", "tokens-per-replica"] as const).filter((f) => flags[f] !== undefined);
  if (isPublishedMix(mix) && costFlags.length) {
    throw new UsageError(`--${costFlags.join(", --")} shape the ${MIXES.join(" and ")} mixes; the ${mix} mix's jobs come with their own iterations and costs`);
  }
  return {
    mix,
    meanHours: flags["mean-hours"] ?? preset.meanHours ?? 2,
    epFactor: flags["ep-factor"] ?? preset.epFactor ?? 0,
    tokensPerReplica: flags["tokens-per-replica"] ?? DEFAULT_TOKENS_PER_REPLICA,
  };
}

/** `--slurm-array DIR`: submits a task per variant and load, each a simulate of its own, and the job that merges them. */
function submitSweep(argv: readonly string[], dir: string, flags: SimulateFlags, scenario: Scenario, io: Io): ExitCode {
  if (scenario.replayed !== undefined)
    throw new UsageError(
      `--slurm-array splits a preset's generated runs by variant and load; a --${flags.trace === undefined ? "from-sacct" : "trace"} file is one run`,
    );
  outputDir("slurm-array", dir);
  const kept = withoutFlags(argv, SWEEP_FLAGS);
  const loads = flags.loads ?? [...scenario.preset.loads];
  const tasks = scenario.variants.flatMap((v) => loads.map((load) => [...kept, ...(v ? ["--variants", v.name] : []), "--loads", String(load)]));
  const sbatchArgs = flags.sbatch?.split(/\s+/).filter((a) => a !== "") ?? [];
  const submitted = submitArray(dir, tasks, sbatchArgs);
  io.out.write(
    `submitted ${tasks.length} runs as job array ${submitted.array} (${submitted.script}), merged by job ${submitted.merge} into ${join(dir, "merged.json")} and ${join(dir, "report", "index.html")}\n`,
  );
  return ExitCode.ok;
}

/** A variant's settings, and the number of hosts its traces are drawn for. */
interface VariantSetting {
  readonly name: string | null;
  readonly config: SimConfigInput;
  readonly hosts: number;
}

function variantSettings(config: SimConfigInput, variants: readonly (Variant | null)[]): VariantSetting[] {
  return variants.map((variant) => {
    const variantConfig = applyVariant(config, variant);
    return { name: variant?.name ?? null, config: variantConfig, hosts: variantConfig.fabric.racks * variantConfig.fabric.hostsPerRack };
  });
}

/** The traces to run on a cluster of so many hosts: replayed ones whatever its size, generated ones drawn for it. */
type Traces = (hostCount: number) => readonly Trace[];

/** The runs' traces, and how generated ones were drawn (null for replayed ones). */
async function chooseTraces(
  flags: SimulateFlags,
  scenario: Scenario,
  settings: readonly VariantSetting[],
  io: Io,
): Promise<{ traces: Traces; generation: TraceGeneration | null }> {
  if (flags.trace !== undefined) {
    const replay = [{ load: null, jobs: await readTraceFile(flags.trace) }];
    return { traces: () => replay, generation: null };
  }
  if (flags["from-sacct"] !== undefined) {
    const replay = await sacctTrace(flags["from-sacct"], flags, scenario.fabric, io);
    return { traces: () => replay, generation: null };
  }
  return generatedTraces(flags, scenario, settings);
}

/** `--from-sacct`'s history as a trace, saved with `--save-trace`; says which jobs it skipped. */
async function sacctTrace(path: string, flags: SimulateFlags, fabric: FabricShape, io: Io): Promise<Trace[]> {
  const options = {
    gpusPerHost: fabric.gpusPerHost,
    nicBytesPerSecond: bytesPerSecond(fabric.nicGbps),
    ...(flags.model === undefined ? {} : { model: flags.model }),
  };
  const { jobs, skipped } = sacctToTrace(await readSacct(path), options, `sacct ${path}`);
  if (skipped.length)
    io.err.write(
      `${path}: skipped ${skipped.length} jobs that never ran or held no GPU (${skipped
        .slice(0, 5)
        .map((s) => s.job)
        .join(", ")}${skipped.length > 5 ? ", …" : ""})\n`,
    );
  if (jobs.length === 0) throw new InvalidInputError(`sacct ${path}`, [{ path: "jobs", message: "no job that ran on GPUs" }]);
  const replay = [{ load: null, jobs }];
  if (flags["save-trace"] !== undefined) await saveTraces(flags["save-trace"], replay);
  return replay;
}

/** A trace per load, drawn once for each number of hosts a variant runs on, and saved with `--save-trace`. */
async function generatedTraces(
  flags: SimulateFlags,
  scenario: Scenario,
  settings: readonly VariantSetting[],
): Promise<{ traces: Traces; generation: TraceGeneration }> {
  const { preset, seed, fabric, drawing } = scenario;
  const loads = flags.loads ?? [...preset.loads];
  const jobCount = flags.jobs ?? preset.jobs;
  const generation = {
    ...presetGeneration(preset),
    mix: drawing.mix,
    jobs: jobCount,
    meanHours: drawing.meanHours,
    epFactor: drawing.epFactor,
    tokensPerReplica: drawing.tokensPerReplica,
  };
  const generated = new Map<number, Trace[]>();
  const traces = (hostCount: number) => {
    if (!generated.has(hostCount)) {
      const draw = (load: number) => generateJobs({ ...generation, seed, hostCount, load, gpusPerHost: fabric.gpusPerHost }, bytesPerSecond(fabric.nicGbps));
      generated.set(
        hostCount,
        loads.map((load) => ({ load, jobs: draw(load) })),
      );
    }
    return generated.get(hostCount)!;
  };
  const saveDir = flags["save-trace"];
  if (saveDir !== undefined) {
    const base = fabric.racks * fabric.hostsPerRack;
    const saved = new Set<number>();
    for (const {
      config: { fabric: shape },
      hosts,
    } of settings) {
      // A variant on another number of hosts draws traces of its own.
      if (!saved.has(hosts)) await saveTraces(saveDir, traces(hosts), { ...generation, seed, fabric: shape, loads }, hosts === base ? "" : `hosts-${hosts}-`);
      saved.add(hosts);
    }
  }
  return { traces, generation };
}

/** A run per variant, trace and system, in that order, each numbered by its place. */
export function runRequests(settings: readonly VariantSetting[], traces: Traces, systems: readonly SystemName[], samples: boolean): RunRequest[] {
  const requests: RunRequest[] = [];
  for (const { name, config, hosts } of settings) {
    for (const { load, jobs } of traces(hosts)) {
      for (const system of systems) requests.push({ index: requests.length, system, variant: name, load, config, jobs, samples });
    }
  }
  return requests;
}

/**
 * Runs the requests on `threads` threads, showing each one's progress, appending each finished
 * run to `--csv DIR`'s files and keeping its fragmentation over time where it is charted.
 */
async function runWithProgress(
  requests: readonly RunRequest[],
  threads: number,
  csvDir: string | undefined,
  charted: boolean,
  io: Io,
): Promise<{ runs: VariantRun[]; fragmentation: FragmentationSeries[] }> {
  const csv = csvDir === undefined ? undefined : await CsvFiles.open(csvDir);
  const progress = new Progress(
    io,
    requests.map((r) => ({ label: `${runLabel(r.system, r.variant)}${r.load === null ? "" : ` at load ${r.load}`}`, jobs: r.jobs.length })),
  );
  const runs: VariantRun[] = [];
  const fragmentation: FragmentationSeries[] = [];
  await runAll(requests, threads, {
    progress: (index, done) => progress.progress(index, done),
    finished: async ({ index, run, rows, busiest, total, seconds }) => {
      const { variant, load, system } = requests[index]!;
      const series = runLabel(system, variant);
      if (charted) fragmentation.push({ load, variant, busiest: { name: series, points: busiest }, total: { name: series, points: total } });
      runs.push({ run, load, variant });
      progress.finished(index, seconds);
      await csv?.append(rows, systemReport(run, load, variant));
    },
  });
  progress.done();
  return { runs, fragmentation };
}

/**
 * What a `--slurm-array` task is not given of the user's flags: the array's own, the outputs
 * (each task prints its JSON report; the merge writes the page) and what splits the sweep.
 */
const SWEEP_FLAGS = new Set(["slurm-array", "sbatch", "report", "plot", "csv", "save-trace", "json", "variants", "loads"]);

/** `argv` without the flags named (and the value of each that takes one). */
function withoutFlags(argv: readonly string[], names: ReadonlySet<string>): string[] {
  const kept: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const [name, inline] = argv[i]!.startsWith("--") ? argv[i]!.slice(2).split(/=(.*)/s) : [];
    if (name === undefined || !names.has(name)) kept.push(argv[i]!);
    else if (inline === undefined && name !== "json") i++;
  }
  return kept;
}

/** The flags `--merge` works with: it runs nothing, so nothing that shapes a run applies. */
const MERGE_FLAGS = new Set(["merge", "report", "plot", "json"]);

async function merge(argv: readonly string[], paths: readonly string[], flags: { report?: string; plot?: string; json: boolean }, io: Io): Promise<ExitCode> {
  const others = argv
    .filter((a) => a.startsWith("--"))
    .map((a) => a.slice(2).split("=")[0]!)
    .filter((name) => !MERGE_FLAGS.has(name));
  if (others.length) throw new UsageError(`--${others.join(", --")}: --merge reads runs already made; give only --report, --plot or --json with it`);
  for (const flag of ["report", "plot"] as const) if (flags[flag] !== undefined) outputDir(flag, flags[flag]);
  const reports = mergeReports(await Promise.all(paths.map(async (path) => ({ path, text: await readInputFile(path, "report", MAX_REPORT_BYTES) }))));
  await writeCharts(flags, reports, []);
  if (flags.json) await writeJson(io, reports);
  else io.out.write(`${reports.map((r) => `seed ${r.config.seed}\n${render(r.systems, r.config)}`).join("\n\n")}${paperBeside(reports)}\n`);
  return ExitCode.ok;
}

/** A trace to run: generated for a load, or replayed (`load` null). */
interface Trace {
  readonly load: number | null;
  readonly jobs: SimJob[];
}

interface VariantRun {
  readonly run: SystemRun;
  readonly load: number | null;
  readonly variant: string | null;
}

/** The flag that sets each setting a preset's variants may sweep. */
const SWEPT_FLAGS = { racks: "racks", hostsPerRack: "hosts-per-rack", uplinksPerRack: "uplinks", lambda: "lambda", scheduler: "scheduler" } as const;

/** A run's name beside its system's, where the preset has variants. */
const runLabel = (system: string, variant: string | null): string => (variant === null ? system : `${system} ${variant}`);

/** The preset's variants that `--variants` names (all by default); [null] for a preset that sweeps nothing. */
function chooseVariants(presetName: string, preset: Preset, flags: SimulateFlags): (Variant | null)[] {
  const all = preset.variants ?? [];
  if (all.length === 0) {
    if (flags.variants !== undefined) throw new UsageError(`--variants: the ${presetName} preset sweeps nothing beside its loads`);
    return [null];
  }
  const names = all.map((v) => v.name);
  const swept = sweptSettings(all)
    .map((setting) => SWEPT_FLAGS[setting])
    .filter((flag) => flags[flag] !== undefined);
  if (swept.length)
    throw new UsageError(
      `--${swept.join(", --")}: the ${presetName} preset sweeps ${swept.length > 1 ? "these" : "it"} itself (variants ${names.join(", ")}); pick variants with --variants`,
    );
  return listFlag("variants", flags.variants, [...all], (name) => {
    const variant = all.find((v) => v.name === name);
    if (!variant) throw new UsageError(`--variants: the ${presetName} preset has no variant "${name}"; choose from ${names.join(", ")}`);
    return variant;
  });
}

function listFlag<T>(name: string, raw: string | undefined, fallback: T[], parse: (item: string) => T): T[] {
  if (raw === undefined) return fallback;
  const items = raw
    .split(",")
    .map((s) => s.trim())
    .filter((s) => s !== "");
  if (items.length === 0) throw new UsageError(`--${name} needs at least one value`);
  return items.map(parse);
}

async function readSacct(path: string): Promise<unknown> {
  const text = await readInputFile(path, "sacct", MAX_TRACE_BYTES);
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new InvalidInputError(`sacct ${path}`, [{ path: "", message: `not JSON (${(error as Error).message}); give the output of sacct --json` }]);
  }
}

/** `--restart SEC` or the overhead `--restart-from FILE` measured; 10 s without either. */
function restartSeconds(seconds: number | undefined, bench: string | undefined): number {
  if (seconds !== undefined && bench !== undefined) throw new UsageError("--restart and --restart-from both give the restart cost; pass one");
  return bench === undefined ? (seconds ?? 10) : restartFromBench(bench);
}

async function readTraceFile(path: string): Promise<SimJob[]> {
  const source = `trace ${path}`;
  const text = await readInputFile(path, "trace", MAX_TRACE_BYTES);
  const values: unknown[] = [];
  const lineNumbers: number[] = [];
  text.split("\n").forEach((line, i) => {
    if (line.trim() === "") return;
    if (values.length === MAX_TRACE_JOBS) throw tooManyJobs(source);
    try {
      values.push(JSON.parse(line));
    } catch (error) {
      throw new InvalidInputError(`${source} line ${i + 1}`, [{ path: "", message: `not JSON (${(error as Error).message})` }]);
    }
    lineNumbers.push(i + 1);
  });
  if (values.length === 0) throw new InvalidInputError(source, [{ path: "", message: "no jobs: write one JSON object per line" }]);
  return parseSimJobs(values, source, lineNumbers);
}

/** Writes the traces, and for generated ones DIR/generation.json: what drew them. */
async function saveTraces(
  dir: string,
  traces: readonly Trace[],
  generation?: TraceGeneration & { seed: number; fabric: SimConfigInput["fabric"]; loads: readonly number[] },
  prefix = "",
): Promise<void> {
  for (const { load, jobs } of traces) {
    await writeFile(join(dir, `trace-${prefix}${load ?? "sacct"}.jsonl`), jobs.map((job) => JSON.stringify(job)).join("\n") + "\n");
  }
  if (generation) await writeFile(join(dir, `${prefix}generation.json`), `${JSON.stringify(generation, null, 2)}\n`);
}

/** `--plot`'s SVG files, each of the report page's charts as DIR/NAME.svg, and `--report`'s page. */
async function writeCharts(
  flags: { report?: string; plot?: string },
  reports: readonly SimulationReport[],
  fragmentation: readonly FragmentationSeries[],
): Promise<void> {
  if (flags.plot !== undefined) for (const figure of figures(reports, fragmentation)) await writeFile(join(flags.plot, `${figure.name}.svg`), figure.svg);
  if (flags.report !== undefined) await writeFile(join(flags.report, "index.html"), reportPage(reports, fragmentation));
}

const csvHeaders = {
  jobs: "system,variant,load,job,arrival,start,finish,ideal,slowdown,moves",
  plans: "system,variant,load,time,status,moves,solve_ms",
  fragmentation: "system,variant,load,time,max_rack,mean_rack,fragmented_groups,total",
  summary:
    "system,variant,load,jobs,slowdown_avg,slowdown_p50,slowdown_p90,slowdown_p99,makespan_s,migrations,bytes_moved,events,moves_avg,moves_share_1_or_2,frag_peak_max_rack,frag_mean_max_rack,solver_total_ms,frag_mean_total",
} as const;

/** The CSV files of a run, appended to as each system finishes. */
class CsvFiles {
  private constructor(readonly dir: string) {}

  static async open(dir: string): Promise<CsvFiles> {
    for (const [name, header] of Object.entries(csvHeaders)) await writeFile(join(dir, `${name}.csv`), `${header}\n`);
    return new CsvFiles(dir);
  }

  async append(rows: CsvLines, s: SystemReport): Promise<void> {
    const lines = (list: readonly string[]) => (list.length ? `${list.join("\n")}\n` : "");
    await appendFile(join(this.dir, "jobs.csv"), lines(rows.jobs));
    await appendFile(join(this.dir, "plans.csv"), lines(rows.plans));
    await appendFile(join(this.dir, "fragmentation.csv"), lines(rows.fragmentation));
    const summary = [
      s.name,
      s.variant ?? "",
      s.load ?? "",
      s.jobs,
      s.slowdown.avg,
      s.slowdown.p50,
      s.slowdown.p90,
      s.slowdown.p99,
      s.makespanSeconds,
      s.migrations,
      s.bytesMoved,
      s.events.count,
      s.events.moves.avg,
      s.events.moves.shareOneOrTwo,
      s.fragmentation.peakMaxRack,
      s.fragmentation.meanMaxRack,
      s.solver.totalMs,
      s.fragmentation.meanTotal,
    ];
    await appendFile(join(this.dir, "summary.csv"), `${summary.join(",")}\n`);
  }
}

/** For a fig-* preset, the paper's headline numbers beside ours (over every seed given), as a table after the runs'. */
function paperBeside(reports: readonly SimulationReport[]): string {
  const found = headlineTable(reports);
  return found ? `\n\nthe paper's numbers beside ours\n${table(found.header, found.rows)}` : "";
}

function render(systems: readonly SystemReport[], config: SimConfigInput): string {
  const f = config.fabric;
  const oversubscription = (f.hostsPerRack * f.gpusPerHost) / f.uplinksPerRack;
  const head = `${f.racks} racks × ${f.hostsPerRack} hosts × ${f.gpusPerHost} GPUs, ${f.uplinksPerRack} uplinks per rack (${oversubscription.toFixed(0)}:1)${fabricSummary(f)}, λ = ${config.lambda ?? f.uplinksPerRack}`;
  const variants = systems.some((s) => s.variant !== null);
  const rows = systems.map((s) => [
    ...(variants ? [s.variant ?? ""] : []),
    s.load === null ? "trace" : `${Math.round(s.load * 100)}%`,
    s.name,
    s.jobs,
    s.slowdown.avg.toFixed(3),
    s.slowdown.p50.toFixed(3),
    s.slowdown.p90.toFixed(3),
    s.slowdown.p99.toFixed(3),
    (s.makespanSeconds / 3600).toFixed(1),
    s.migrations,
    s.events.count,
    s.events.count ? s.events.moves.avg.toFixed(2) : "-",
    s.solver.plans ? (s.solver.totalMs / s.solver.plans).toFixed(1) : "-",
  ]);
  return [
    head,
    "",
    table(
      [
        ...(variants ? ["variant"] : []),
        "load",
        "system",
        "jobs",
        "slowdown avg",
        "p50",
        "p90",
        "p99",
        "makespan h",
        "moves",
        "events",
        "moves/event",
        "solve ms/plan",
      ],
      rows,
    ),
  ].join("\n");
}
