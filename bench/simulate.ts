// Simulator benchmark: the paper's §7 experiments as presets, every system on the same traces.
//
// Prints job slowdown per system and load with each system's p99 over MonkeyTree's, the
// defragmentation events (moves per event, the planner's time), and how long each system took
// to simulate against ECMP's time in the same run.
//
//   npm run bench:simulate -- --preset paper-1024 --loads 0.5,0.7,0.9,1
import { intFlag, parseFlags, table, UsageError } from "../cli/io.ts";
import { benchMain } from "./entry.ts";
import { createPlanner } from "../controller/plan/index.ts";
import {
  bytesPerSecond,
  generateJobs,
  PRESETS,
  simulateSystem,
  systemReport,
  systemSpec,
  SYSTEMS,
  moveEvents,
  type PresetName,
  type SystemName,
  type SystemReport,
  type PlanEvent,
} from "../controller/sim/index.ts";

const presetNames = Object.keys(PRESETS) as PresetName[];

const help = `usage: npm run bench:simulate -- [options]

Runs a simulator preset's systems on its generated traces and prints slowdowns, moves per
defragmentation event and simulation times.

options:
  --preset NAME   ${presetNames.join(" | ")} (default paper-1024)
  --loads LIST    offered loads (default: the preset's)
  --jobs N        jobs per trace (default: the preset's)
  --systems LIST  (default: the preset's)
  --seed N        trace seed (default 1)
  --help          this text`;

function options(argv: string[]) {
  const flags = parseFlags(argv, {
    preset: { type: "string", default: "paper-1024" },
    loads: { type: "string" },
    jobs: { type: "string" },
    systems: { type: "string" },
    seed: { type: "string" },
    help: { type: "boolean", default: false },
  });
  const preset = PRESETS[flags.preset as PresetName];
  if (!preset) throw new UsageError(`--preset must be one of ${presetNames.join(", ")}`);
  const loads = flags.loads === undefined ? [...preset.loads] : flags.loads.split(",").map(Number);
  if (loads.some((l) => !(l > 0 && l <= 1))) throw new UsageError("--loads must be numbers in (0, 1]");
  const systems = (flags.systems === undefined ? [...preset.systems] : flags.systems.split(",")) as SystemName[];
  for (const s of systems) if (!SYSTEMS.includes(s)) throw new UsageError(`unknown system ${s}`);
  return {
    help: flags.help,
    name: flags.preset as PresetName,
    preset,
    loads,
    systems,
    jobs: intFlag("jobs", flags.jobs, preset.jobs, 1),
    seed: intFlag("seed", flags.seed, 1, 0),
  };
}

interface Cell {
  readonly report: SystemReport;
  readonly plans: readonly PlanEvent[];
  readonly seconds: number;
}

async function run(o: ReturnType<typeof options>): Promise<number> {
  const { preset } = o;
  const planner = o.systems.some((s) => systemSpec(s).migrate) ? await createPlanner() : undefined;
  const hostCount = preset.fabric.racks * preset.fabric.hostsPerRack;
  const config = { fabric: preset.fabric, ...("lambda" in preset ? { lambda: preset.lambda } : {}), seed: o.seed };
  const cells = new Map<string, Cell>();
  const key = (system: string, load: number) => `${system}@${load}`;
  for (const load of o.loads) {
    const ep = "epFactor" in preset ? { epFactor: preset.epFactor, warmupJobs: preset.warmupJobs } : {};
    const generate = { seed: o.seed, hostCount, mix: preset.mix, load, jobs: o.jobs, ...ep, meanHours: preset.meanHours, gpusPerHost: preset.fabric.gpusPerHost };
    const jobs = generateJobs(generate, bytesPerSecond(preset.fabric.nicGbps));
    for (const system of o.systems) {
      const started = performance.now();
      const result = simulateSystem(jobs, config, system, planner);
      const seconds = (performance.now() - started) / 1000;
      cells.set(key(system, load), { report: systemReport(result, load), plans: result.plans, seconds });
      process.stderr.write(`${system} at load ${load}: ${seconds.toFixed(1)} s\n`);
    }
  }
  const f = preset.fabric;
  const lambda = "lambda" in preset ? preset.lambda : f.uplinksPerRack;
  process.stdout.write(
    `${o.name}: ${f.racks * f.hostsPerRack * f.gpusPerHost} GPUs (${f.racks} racks × ${f.hostsPerRack} hosts × ${f.gpusPerHost}), ` +
      `${f.uplinksPerRack} uplinks per rack (${(f.hostsPerRack * f.gpusPerHost) / f.uplinksPerRack}:1), λ = ${lambda}, ${preset.mix} mix, ${o.jobs} jobs per load, seed ${o.seed}\n\n`,
  );
  const pct = (load: number) => `${Math.round(load * 100)}%`;
  const slowdownTable = (title: string, pick: (r: SystemReport) => number) => {
    const last = o.loads[o.loads.length - 1]!;
    const base = o.systems.includes("monkeytree") ? cells.get(key("monkeytree", last))!.report : undefined;
    const rows = o.systems.map((s) => [
      s,
      ...o.loads.map((l) => pick(cells.get(key(s, l))!.report).toFixed(3)),
      base ? (pick(cells.get(key(s, last))!.report) / pick(base)).toFixed(2) : "-",
    ]);
    return `${title}\n${table(["system", ...o.loads.map(pct), `÷ monkeytree at ${pct(last)}`], rows)}\n\n`;
  };
  process.stdout.write(slowdownTable("p99 slowdown (JCT ÷ ideal JCT)", (r) => r.slowdown.p99));
  process.stdout.write(slowdownTable("average slowdown", (r) => r.slowdown.avg));

  const migrating = o.systems.filter((s) => systemSpec(s).migrate);
  if (migrating.length) {
    const rows = migrating.flatMap((s) =>
      o.loads.map((l) => {
        const { report, plans } = cells.get(key(s, l))!;
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
    process.stdout.write(
      `defragmentation events (plans that moved workers)\n${table(["system", "load", "events", "moves/event", "1-2 moves", "histogram (moves:events)", "most moves of a job", "solve p50 ms", "p99 ms"], rows)}\n\n`,
    );
  }

  const total = (s: SystemName) => o.loads.reduce((sum, l) => sum + cells.get(key(s, l))!.seconds, 0);
  const baseline = o.systems.includes("ecmp") ? total("ecmp") : undefined;
  const speedRows = o.systems.map((s) => [s, total(s).toFixed(1), baseline ? (total(s) / baseline).toFixed(2) : "-"]);
  process.stdout.write(`simulation time over all loads (${o.jobs} jobs each)\n${table(["system", "seconds", "÷ ecmp"], speedRows)}\n`);
  return 0;
}

await benchMain("simulate", help, options, run);
