import { appendFile, mkdir, readFile, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { InvalidInputError } from "../sdk/errors.ts";
import { MAX_GPUS_PER_HOST, MAX_HOSTS, MAX_HOSTS_PER_RACK, MAX_RACKS, MAX_UPLINKS_PER_RACK } from "../sdk/protocol/limits.ts";
import { createPlanner } from "../controller/plan/index.ts";
import {
  bytesPerSecond,
  generateJobs,
  MIXES,
  parseSimJobs,
  PRESETS,
  SCHEDULERS,
  simulateSystem,
  simulationReport,
  systemReport,
  systemSpec,
  SYSTEMS,
  type Preset,
  type Mix,
  type PresetName,
  type SchedulerName,
  type SimConfigInput,
  type SimJob,
  type SystemName,
  type SimulationReport,
  type SystemReport,
  type SystemRun,
} from "../controller/sim/index.ts";
import { barChart, lineChart, type Series } from "./simulate/plot.ts";
import { ExitCode, intFlag, numberFlag, parseFlags, table, UsageError, writeJson, type Command, type Io } from "./io.ts";

const presetNames = Object.keys(PRESETS) as PresetName[];
/** A trace file larger than this is refused: a million jobs' lines fit easily. */
const MAX_TRACE_BYTES = 256 * 1024 * 1024;

const help = `usage: monkeytree simulate [--preset NAME | --trace FILE] [--systems LIST] [--loads LIST] [--jobs N]
                           [--racks N] [--hosts-per-rack N] [--gpus-per-host N] [--uplinks N] [--nic-gbps G]
                           [--mix NAME] [--mean-hours H] [--ep-factor X] [--seed N] [--scheduler NAME]
                           [--lambda N] [--restart SEC] [--json] [--csv DIR] [--plot DIR] [--save-trace DIR]

What-if simulation of a shared GPU cluster: a Poisson trace of jobs from the paper's model
table (or your own history) runs on a flow-level, max-min fair 2-tier Clos, once per system:
routing alone (ECMP, Crux, SGLB, Perfect), MonkeyTree's planner and migrations in front of a
routing, and packet spraying on a full-bisection fabric as the ideal. Prints, per system and
load, job slowdown (completion time ÷ ideal), makespan, migrations and planner effort.

options:
  --preset NAME      ${presetNames.join(" | ")}
                     (default small): the fabric, λ, job mix, loads, job count and systems
                     of an experiment (see README)
  --trace FILE       replay jobs from a JSON-lines file instead of generating them (one job per
                     line; see README); runs on the preset's fabric unless given one
  --systems LIST     comma-separated (default: the preset's), from
                     ${SYSTEMS.join(", ")}
  --loads LIST       offered loads in (0, 1], comma-separated (default: the preset's)
  --jobs N           jobs per generated trace (default: the preset's)
  --racks N, --hosts-per-rack N, --gpus-per-host N, --uplinks N, --nic-gbps G
                     your own 2-tier fabric: racks, hosts per rack, GPUs (and NICs) per host,
                     uplinks per rack (one per spine), link speed (default: the preset's)
  --mix NAME         job mix of generated traces: ${MIXES.join(" | ")} (default: the preset's)
  --mean-hours H     mean ideal job duration of generated traces (default: the preset's)
  --ep-factor X      expert-parallel all-to-all bytes per host as a multiple of its DP ring
                     bytes (paper §7.10: 10; default: the preset's, else 0)
  --seed N           seeds the traces, ECMP source ports, SGLB and the random scheduler (default 1)
  --scheduler NAME   front-end scheduler: ${SCHEDULERS.join(" | ")} (default best-fit)
  --lambda N         MonkeyTree's per-rack bound (default: the preset's, else the uplinks per rack)
  --restart SEC      restart cost of a migration after its transfers (default 10)
  --json             print one JSON document (schema: SimulationReportSchema) instead of tables
  --csv DIR          write jobs.csv, plans.csv, fragmentation.csv and summary.csv, system by system
  --plot DIR         draw SVG charts: slowdown (avg, p99) against load, the busiest rack's
                     fragmentation over time per load, moves per defragmentation event
  --save-trace DIR   write each generated trace as DIR/trace-LOAD.jsonl, replayable with --trace

Progress goes to stderr. exit codes: 0 done, 2 bad usage or input, 3 internal error`;

export const command: Command = {
  summary: "simulate a cluster trace with and without MonkeyTree, comparing job slowdowns",
  help,
  async run(argv, io) {
    const flags = parseFlags(argv, {
      preset: { type: "string" },
      trace: { type: "string" },
      systems: { type: "string" },
      loads: { type: "string" },
      jobs: { type: "string" },
      racks: { type: "string" },
      "hosts-per-rack": { type: "string" },
      "gpus-per-host": { type: "string" },
      uplinks: { type: "string" },
      "nic-gbps": { type: "string" },
      mix: { type: "string" },
      "mean-hours": { type: "string" },
      "ep-factor": { type: "string" },
      seed: { type: "string" },
      scheduler: { type: "string", default: "best-fit" },
      lambda: { type: "string" },
      restart: { type: "string" },
      json: { type: "boolean", default: false },
      csv: { type: "string" },
      plot: { type: "string" },
      "save-trace": { type: "string" },
    });
    const presetName = (flags.preset ?? "small") as PresetName;
    const preset: Preset | undefined = PRESETS[presetName];
    if (!preset) throw new UsageError(`--preset must be one of ${presetNames.join(", ")}, got "${flags.preset}"`);
    const systems = listFlag("systems", flags.systems, [...preset.systems], (name) => {
      if (!(SYSTEMS as readonly string[]).includes(name)) throw new UsageError(`--systems: unknown system "${name}"; choose from ${SYSTEMS.join(", ")}`);
      return name as SystemName;
    });
    const scheduler = flags.scheduler as SchedulerName;
    if (!SCHEDULERS.includes(scheduler)) throw new UsageError(`--scheduler must be one of ${SCHEDULERS.join(", ")}, got "${flags.scheduler}"`);
    const generatorFlags = ["loads", "jobs", "mix", "mean-hours", "ep-factor", "save-trace"] as const;
    if (flags.trace !== undefined && generatorFlags.some((f) => flags[f] !== undefined)) {
      throw new UsageError(`--${generatorFlags.join(", --")} shape generated traces; with --trace the file gives the jobs`);
    }
    const seed = intFlag("seed", flags.seed, 1, 0, 2 ** 31 - 1);
    const lambda = flags.lambda === undefined ? preset.lambda : intFlag("lambda", flags.lambda, undefined, 0);
    const fabric = {
      racks: intFlag("racks", flags.racks, preset.fabric.racks, 1, MAX_RACKS),
      hostsPerRack: intFlag("hosts-per-rack", flags["hosts-per-rack"], preset.fabric.hostsPerRack, 1, MAX_HOSTS_PER_RACK),
      gpusPerHost: intFlag("gpus-per-host", flags["gpus-per-host"], preset.fabric.gpusPerHost, 1, MAX_GPUS_PER_HOST),
      uplinksPerRack: intFlag("uplinks", flags.uplinks, preset.fabric.uplinksPerRack, 1, MAX_UPLINKS_PER_RACK),
      nicGbps: numberFlag("nic-gbps", flags["nic-gbps"], preset.fabric.nicGbps, 0.001),
    };
    if (fabric.racks * fabric.hostsPerRack > MAX_HOSTS) {
      throw new UsageError(`--racks × --hosts-per-rack (${fabric.racks} × ${fabric.hostsPerRack}) must be at most ${MAX_HOSTS} hosts, the largest cluster the planner supports`);
    }
    const mix = (flags.mix ?? preset.mix) as Mix;
    if (!MIXES.includes(mix)) throw new UsageError(`--mix must be one of ${MIXES.join(", ")}, got "${flags.mix}"`);
    const meanHours = numberFlag("mean-hours", flags["mean-hours"], preset.meanHours, 0.001);
    const epFactor = numberFlag("ep-factor", flags["ep-factor"], preset.epFactor ?? 0, 0);
    const config: SimConfigInput = {
      fabric,
      ...(lambda === undefined ? {} : { lambda }),
      scheduler,
      seed,
      restartSeconds: numberFlag("restart", flags.restart, 10, 0),
    };

    const traces: { load: number | null; jobs: SimJob[] }[] = [];
    if (flags.trace !== undefined) {
      traces.push({ load: null, jobs: await readTraceFile(flags.trace) });
    } else {
      const loads = listFlag("loads", flags.loads, [...preset.loads], (raw) => {
        const load = Number(raw);
        if (!(load > 0 && load <= 1)) throw new UsageError(`--loads: each load must be a number in (0, 1], got "${raw}"`);
        return load;
      });
      const jobCount = intFlag("jobs", flags.jobs, preset.jobs, 1, 1_000_000);
      const hostCount = fabric.racks * fabric.hostsPerRack;
      for (const load of loads) {
        const options = { seed, hostCount, mix, load, jobs: jobCount, warmupJobs: preset.warmupJobs ?? 0, meanHours, epFactor, gpusPerHost: fabric.gpusPerHost };
        traces.push({ load, jobs: generateJobs(options, bytesPerSecond(fabric.nicGbps)) });
      }
      if (flags["save-trace"] !== undefined) await saveTraces(flags["save-trace"], traces);
    }

    const planner = systems.some((s) => systemSpec(s).migrate) ? await createPlanner() : undefined;
    const csv = flags.csv === undefined ? undefined : await CsvFiles.open(flags.csv);
    const progress = new Progress(io, traces.length * systems.length);
    const runs: { run: SystemRun; load: number | null }[] = [];
    const fragmentation: { system: SystemName; load: number | null; series: Series }[] = [];
    for (const { load, jobs } of traces) {
      for (const system of systems) {
        const rows = new CsvRows(system, load);
        const points: [number, number][] = [];
        if (flags.plot !== undefined) fragmentation.push({ system, load, series: { name: system, points } });
        progress.begin(system, load, jobs.length);
        const run = simulateSystem(jobs, config, system, planner, {
          jobDone: (job) => {
            rows.job(job);
            progress.tick();
          },
          planned: (event) => rows.plan(event),
          sample: (sample) => {
            rows.sample(sample);
            if (flags.plot !== undefined) points.push([sample.time / 3600, sample.maxRack]);
          },
        });
        runs.push({ run, load });
        progress.end();
        await csv?.append(rows, systemReport(run, load));
        // Let the progress line and CSV rows out before the next system's synchronous run.
        await new Promise((resolve) => setImmediate(resolve));
      }
    }
    progress.done();
    const report = simulationReport(config, runs);
    if (flags.plot !== undefined) await writePlots(flags.plot, report, fragmentation);
    if (flags.json) await writeJson(io, report);
    else io.out.write(`${render(report.systems, config)}\n`);
    return ExitCode.ok;
  },
};

function listFlag<T>(name: string, raw: string | undefined, fallback: T[], parse: (item: string) => T): T[] {
  if (raw === undefined) return fallback;
  const items = raw.split(",").map((s) => s.trim()).filter((s) => s !== "");
  if (items.length === 0) throw new UsageError(`--${name} needs at least one value`);
  return items.map(parse);
}

async function readTraceFile(path: string): Promise<SimJob[]> {
  const source = `trace ${path}`;
  let text: string;
  try {
    const { size } = await stat(path);
    if (size > MAX_TRACE_BYTES) throw new InvalidInputError(source, [{ path: "", message: `${size} bytes is more than the ${MAX_TRACE_BYTES} a trace may have` }]);
    text = await readFile(path, "utf8");
  } catch (error) {
    if (error instanceof InvalidInputError) throw error;
    const reason = (error as NodeJS.ErrnoException).code === "ENOENT" ? "no such file" : String((error as Error).message);
    throw new InvalidInputError(source, [{ path: "", message: `cannot read it (${reason})` }]);
  }
  const values: unknown[] = [];
  const lineNumbers: number[] = [];
  text.split("\n").forEach((line, i) => {
    if (line.trim() === "") return;
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

async function saveTraces(dir: string, traces: readonly { load: number | null; jobs: readonly SimJob[] }[]): Promise<void> {
  await mkdir(dir, { recursive: true });
  for (const { load, jobs } of traces) {
    await writeFile(join(dir, `trace-${load}.jsonl`), jobs.map((job) => JSON.stringify(job)).join("\n") + "\n");
  }
}

async function writePlots(dir: string, report: SimulationReport, fragmentation: readonly { system: SystemName; load: number | null; series: Series }[]): Promise<void> {
  await mkdir(dir, { recursive: true });
  const names = [...new Set(report.systems.map((s) => s.name))];
  const bySystem = (pick: (s: SystemReport) => number): Series[] =>
    names.map((name) => ({ name, points: report.systems.filter((s) => s.name === name).map((s) => [100 * (s.load ?? 1), pick(s)] as const) }));
  const load = "offered load (%)";
  await writeFile(join(dir, "slowdown-p99.svg"), lineChart({ title: "p99 job slowdown", xLabel: load, yLabel: "JCT ÷ ideal JCT", series: bySystem((s) => s.slowdown.p99), yFrom: 1 }));
  await writeFile(join(dir, "slowdown-avg.svg"), lineChart({ title: "average job slowdown", xLabel: load, yLabel: "JCT ÷ ideal JCT", series: bySystem((s) => s.slowdown.avg), yFrom: 1 }));
  for (const l of new Set(fragmentation.map((f) => f.load))) {
    const series = fragmentation.filter((f) => f.load === l).map((f) => f.series);
    const title = `busiest rack's fragmentation${l === null ? "" : ` at ${Math.round(l * 100)}% load`}`;
    await writeFile(join(dir, `fragmentation-${l ?? "trace"}.svg`), lineChart({ title, xLabel: "hours", yLabel: "max rings per rack", series, step: true }));
  }
  const histogram = Object.entries(report.events.moves.histogram).sort(([a], [b]) => Number(a) - Number(b));
  if (histogram.length) {
    await writeFile(join(dir, "moves.svg"), barChart("moves per defragmentation event (MonkeyTree systems)", "moves", "events", histogram));
  }
}

const csvHeaders = {
  jobs: "system,load,job,arrival,start,finish,ideal,slowdown,moves",
  plans: "system,load,time,status,moves,solve_ms",
  fragmentation: "system,load,time,max_rack,mean_rack,fragmented_groups",
  summary: "system,load,jobs,slowdown_avg,slowdown_p50,slowdown_p90,slowdown_p99,makespan_s,migrations,bytes_moved,events,moves_avg,moves_share_1_or_2,frag_peak_max_rack,frag_mean_max_rack,solver_total_ms",
} as const;

/** One system's CSV rows, gathered during its run. */
class CsvRows {
  readonly jobs: string[] = [];
  readonly plans: string[] = [];
  readonly fragmentation: string[] = [];
  readonly #prefix: string;
  constructor(system: SystemName, load: number | null) {
    this.#prefix = `${system},${load ?? ""}`;
  }
  job(j: { id: string; arrival: number; start: number; finish: number; ideal: number; slowdown: number; moves: number }): void {
    this.jobs.push(`${this.#prefix},${j.id},${j.arrival},${j.start},${j.finish},${j.ideal},${j.slowdown},${j.moves}`);
  }
  plan(p: { time: number; status: string; moves: number; solveMs: number }): void {
    this.plans.push(`${this.#prefix},${p.time},${p.status},${p.moves},${p.solveMs}`);
  }
  sample(s: { time: number; maxRack: number; meanRack: number; fragmentedGroups: number }): void {
    this.fragmentation.push(`${this.#prefix},${s.time},${s.maxRack},${s.meanRack},${s.fragmentedGroups}`);
  }
}

/** The CSV files of a run, appended to as each system finishes. */
class CsvFiles {
  private constructor(readonly dir: string) {}

  static async open(dir: string): Promise<CsvFiles> {
    await mkdir(dir, { recursive: true });
    for (const [name, header] of Object.entries(csvHeaders)) await writeFile(join(dir, `${name}.csv`), `${header}\n`);
    return new CsvFiles(dir);
  }

  async append(rows: CsvRows, s: SystemReport): Promise<void> {
    const lines = (list: readonly string[]) => (list.length ? `${list.join("\n")}\n` : "");
    await appendFile(join(this.dir, "jobs.csv"), lines(rows.jobs));
    await appendFile(join(this.dir, "plans.csv"), lines(rows.plans));
    await appendFile(join(this.dir, "fragmentation.csv"), lines(rows.fragmentation));
    const summary = [
      s.name,
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
    ];
    await appendFile(join(this.dir, "summary.csv"), `${summary.join(",")}\n`);
  }
}

/** A progress bar on stderr when it is a terminal; otherwise a line per finished system. */
class Progress {
  readonly #tty: boolean;
  #run = 0;
  #label = "";
  #done = 0;
  #total = 0;
  #shown = -1;
  #started = 0;

  constructor(private readonly io: Io, private readonly runs: number) {
    this.#tty = (io.err as { isTTY?: boolean }).isTTY === true;
  }

  begin(system: SystemName, load: number | null, jobs: number): void {
    this.#run++;
    this.#label = `[${this.#run}/${this.runs}] ${system}${load === null ? "" : ` at load ${load}`}`;
    this.#done = 0;
    this.#total = jobs;
    this.#shown = -1;
    this.#started = Date.now();
    this.#draw();
  }

  tick(): void {
    this.#done++;
    this.#draw();
  }

  end(): void {
    const seconds = ((Date.now() - this.#started) / 1000).toFixed(1);
    this.io.err.write(`${this.#tty ? "\r\x1b[K" : ""}${this.#label}: ${this.#total} jobs in ${seconds} s\n`);
  }

  done(): void {
    if (this.#tty) this.io.err.write("\r\x1b[K");
  }

  #draw(): void {
    if (!this.#tty) return;
    const width = 30;
    const filled = this.#total ? Math.round((this.#done / this.#total) * width) : width;
    if (filled === this.#shown) return;
    this.#shown = filled;
    this.io.err.write(`\r\x1b[K${this.#label} ${"█".repeat(filled)}${"░".repeat(width - filled)} ${this.#done}/${this.#total} jobs`);
  }
}

const fixed = (value: number, digits: number) => value.toFixed(digits);

function render(systems: readonly SystemReport[], config: SimConfigInput): string {
  const f = config.fabric;
  const oversubscription = (f.hostsPerRack * f.gpusPerHost) / f.uplinksPerRack;
  const head = `${f.racks} racks × ${f.hostsPerRack} hosts × ${f.gpusPerHost} GPUs, ${f.uplinksPerRack} uplinks per rack (${fixed(oversubscription, 0)}:1), λ = ${config.lambda ?? f.uplinksPerRack}`;
  const rows = systems.map((s) => [
    s.load === null ? "trace" : `${Math.round(s.load * 100)}%`,
    s.name,
    s.jobs,
    fixed(s.slowdown.avg, 3),
    fixed(s.slowdown.p50, 3),
    fixed(s.slowdown.p90, 3),
    fixed(s.slowdown.p99, 3),
    fixed(s.makespanSeconds / 3600, 1),
    s.migrations,
    s.events.count,
    s.events.count ? fixed(s.events.moves.avg, 2) : "-",
    s.solver.plans ? fixed(s.solver.totalMs / s.solver.plans, 1) : "-",
  ]);
  return [
    head,
    "",
    table(["load", "system", "jobs", "slowdown avg", "p50", "p90", "p99", "makespan h", "moves", "events", "moves/event", "solve ms/plan"], rows),
  ].join("\n");
}
