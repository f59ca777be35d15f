import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { SimulationReportSchema, type SimulationReport } from "../../controller/simulator/index.ts";
import { runCli } from "../helpers/cli.ts";

const dir = mkdtempSync(join(tmpdir(), "monkeytree-simulate-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** The report without wall-clock solve times, which differ run to run. */
const repeatable = (report: SimulationReport) => report.systems.map(({ solver: _, ...rest }) => rest);

describe("monkeytree simulate", () => {
  let first: SimulationReport;

  it("prints one JSON document per the schema, writes CSVs system by system, and saves the trace", async () => {
    const csv = join(dir, "csv");
    const traces = join(dir, "traces");
    const result = await runCli("simulate", "--preset", "small", "--json", "--csv", csv, "--save-trace", traces);
    expect(result.code).toBe(0);
    first = SimulationReportSchema.parse(JSON.parse(result.stdout));
    expect(first.systems.map((s) => s.name)).toEqual(["ecmp", "perfect", "monkeytree", "spray"]);
    expect([first.config.queueInMoves, first.config.migrateBy]).toEqual(["place", "plan"]);
    for (const s of first.systems) expect(s.jobs).toBe(100);
    const byName = Object.fromEntries(first.systems.map((s) => [s.name, s]));
    expect(byName.monkeytree!.events.count).toBeGreaterThan(0);
    expect(byName.monkeytree!.slowdown.p99).toBeLessThan(byName.ecmp!.slowdown.p99);
    expect(byName.spray!.slowdown.p99).toBeCloseTo(1, 9);
    // Progress: one line per finished system (stderr is no terminal here).
    expect(result.stderr.trim().split("\n")).toHaveLength(4);

    const lines = (name: string) => readFileSync(join(csv, name), "utf8").trim().split("\n");
    expect(lines("jobs.csv")).toHaveLength(1 + 4 * 100);
    expect(
      lines("summary.csv")
        .slice(1)
        .map((l) => l.split(",")[0]),
    ).toEqual(["ecmp", "perfect", "monkeytree", "spray"]);
    expect(lines("plans.csv").length - 1).toBe(first.systems.reduce((n, s) => n + s.solver.plans, 0));
    expect(lines("fragmentation.csv")[0]).toBe("system,variant,load,time,max_rack,mean_rack,fragmented_groups,total");
    expect(readFileSync(join(traces, "trace-0.9.jsonl"), "utf8").trim().split("\n")).toHaveLength(100);
  });

  it("runs the paper-ep preset's EP-dominated jobs after its warm-up jobs, reporting only the measured ones", async () => {
    const traces = join(dir, "ep-traces");
    const result = await runCli("simulate", "--preset", "paper-ep", "--jobs", "3", "--loads", "0.5", "--systems", "ecmp", "--json", "--save-trace", traces);
    expect(result.code).toBe(0);
    expect(SimulationReportSchema.parse(JSON.parse(result.stdout)).systems[0]!.jobs).toBe(3);
    const jobs = readFileSync(join(traces, "trace-0.5.jsonl"), "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { warmup: boolean; a2aBytes: number; ringBytes: number; rings: number });
    expect(jobs.map((j) => j.warmup)).toEqual([...new Array<boolean>(50).fill(true), false, false, false]);
    for (const j of jobs) expect(j.a2aBytes).toBeCloseTo(10 * j.ringBytes * j.rings, 0);
  });

  it("replays a saved trace to the same results", async () => {
    const result = await runCli("simulate", "--preset", "small", "--trace", join(dir, "traces", "trace-0.9.jsonl"), "--json");
    expect(result.code).toBe(0);
    const replay = SimulationReportSchema.parse(JSON.parse(result.stdout));
    expect(repeatable(replay).map((s) => ({ ...s, load: 0.9 }))).toEqual(repeatable(first));
  });

  it("gives the same report and CSV rows on one thread as on four", async () => {
    const runs = await Promise.all(
      ["1", "4"].map(async (threads) => {
        const csv = join(dir, `csv-threads-${threads}`);
        const result = await runCli("simulate", "--preset", "small", "--loads", "0.8,0.9", "--json", "--threads", threads, "--csv", csv);
        expect(result.code).toBe(0);
        const rows = (name: string) => readFileSync(join(csv, name), "utf8");
        return {
          report: repeatable(SimulationReportSchema.parse(JSON.parse(result.stdout))),
          jobs: rows("jobs.csv"),
          fragmentation: rows("fragmentation.csv"),
          progress: result.stderr,
        };
      }),
    );
    const [one, four] = runs as [(typeof runs)[0], (typeof runs)[0]];
    expect(four.report).toEqual(one.report);
    expect(four.jobs).toBe(one.jobs);
    expect(four.fragmentation).toBe(one.fragmentation);
    // A line per run, in the runs' order, whichever thread finished first.
    const order = (progress: string) =>
      progress
        .trim()
        .split("\n")
        .map((line) => line.split(":")[0]);
    expect(order(four.progress)).toEqual(order(one.progress));
    expect(order(one.progress)).toHaveLength(8);
  });

  it("draws SVG charts: slowdown against load, fragmentation over time, moves per event", async () => {
    const plots = join(dir, "plots");
    const result = await runCli("simulate", "--preset", "small", "--loads", "0.8,0.9", "--plot", plots);
    expect(result.code).toBe(0);
    const svg = (name: string) => readFileSync(join(plots, name), "utf8");
    for (const name of [
      "slowdown-p99.svg",
      "slowdown-avg.svg",
      "fragmentation-0.8.svg",
      "fragmentation-0.9.svg",
      "fragmentation-total-0.8.svg",
      "fragmentation-total-0.9.svg",
    ]) {
      const text = svg(name);
      expect(text.startsWith("<svg ")).toBe(true);
      expect(text.trimEnd().endsWith("</svg>")).toBe(true);
      // One line and one legend entry per system.
      expect(text.match(/<polyline class="mark" fill=/g)).toHaveLength(4);
      for (const system of ["ecmp", "perfect", "monkeytree", "spray"]) expect(text).toContain(`>${system}</text>`);
    }
    // Each slowdown line has a marker per load and one in the legend, a shape of its own.
    const p99 = svg("slowdown-p99.svg");
    expect(p99.match(/class="mark"/g)).toHaveLength(4 + 4 * (2 + 1));
    expect([/<circle class="mark"/g, /<polygon class="mark"/g].map((shape) => p99.match(shape)?.length)).toEqual([3, 9]);
    expect(svg("moves.svg")).toMatch(/<rect class="mark" x="[\d.]+" y="[\d.]+" width="[\d.]+" height="[\d.]+" fill="#1f77b4"\/>/);
  });

  it("prints a table by default", async () => {
    const result = await runCli("simulate", "--preset", "small", "--systems", "ecmp,monkeytree-ecmp");
    expect(result.code).toBe(0);
    expect(result.stdout).toContain("8 racks × 8 hosts × 8 GPUs, 2 uplinks per rack (32:1), λ = 2");
    expect(result.stdout).toMatch(/90%\s+monkeytree-ecmp\s+100\s/);
  });

  it("simulates a fabric given by flags, and reports it", async () => {
    const result = await runCli(
      "simulate",
      "--racks",
      "4",
      "--hosts-per-rack",
      "4",
      "--gpus-per-host",
      "2",
      "--uplinks",
      "1",
      "--nic-gbps",
      "100",
      "--jobs",
      "30",
      "--systems",
      "ecmp",
      "--queue",
      "backfill",
      "--json",
    );
    expect(result.code).toBe(0);
    const report = SimulationReportSchema.parse(JSON.parse(result.stdout));
    expect(report.config.fabric).toEqual({ racks: 4, hostsPerRack: 4, gpusPerHost: 2, uplinksPerRack: 1, nicGbps: 100 });
    expect(report.config.lambda).toBeUndefined();
    expect(report.config.queue).toBe("backfill");
    expect(report.systems[0]!.jobs).toBe(30);
  });

  it("takes the restart cost from bench:migrate's document: the largest overhead it measured", async () => {
    const bench = join(dir, "bench-migrate.json");
    const row = (job: string, overheadS: number | null) => ({ job, bytesPerHost: 2 ** 20, downtimeS: 1, floorS: 0.1, overheadS, phases: {} });
    writeFileSync(bench, JSON.stringify({ rows: [row("ddp", 0.31), row("pp", 0.42), row("tp", null)] }));
    const result = await runCli("simulate", "--preset", "small", "--jobs", "10", "--systems", "monkeytree", "--restart-from", bench, "--json");
    expect(result.code, result.stderr).toBe(0);
    expect(SimulationReportSchema.parse(JSON.parse(result.stdout)).config.restartSeconds).toBe(0.42);
    const both = await runCli("simulate", "--preset", "small", "--restart", "3", "--restart-from", bench);
    expect(both).toMatchObject({ code: 2, stderr: expect.stringContaining("--restart and --restart-from both give the restart cost; pass one") });
    writeFileSync(bench, JSON.stringify({ rows: [row("ddp", null)] }));
    const failed = await runCli("simulate", "--preset", "small", "--restart-from", bench);
    expect(failed.stderr).toContain("no row measured an overhead (every run failed); run the bench again");
    expect(failed.code).not.toBe(0);
  });

  it("generates traces with the local batch given, and records it in the report and beside saved traces", async () => {
    const run = async (...extra: string[]) => {
      const traces = join(dir, `batch${extra.join("")}`);
      const result = await runCli("simulate", "--preset", "small", "--jobs", "20", "--systems", "spray", "--json", "--save-trace", traces, ...extra);
      expect(result.code).toBe(0);
      const jobs = readFileSync(join(traces, "trace-0.9.jsonl"), "utf8")
        .trim()
        .split("\n")
        .map((line) => JSON.parse(line) as { computeSeconds: number });
      const generation = JSON.parse(readFileSync(join(traces, "generation.json"), "utf8")) as { tokensPerReplica: number; seed: number };
      return { report: SimulationReportSchema.parse(JSON.parse(result.stdout)), jobs, generation };
    };
    const full = await run();
    const half = await run("--tokens-per-replica", "32768");
    expect(full.report.generation).toEqual({ mix: "dp", jobs: 20, warmupJobs: 0, meanHours: 2, epFactor: 0, tokensPerReplica: 65536 });
    expect(half.report.generation?.tokensPerReplica).toBe(32768);
    expect(half.generation).toMatchObject({ tokensPerReplica: 32768, seed: 1 });
    expect(half.jobs.map((j) => j.computeSeconds)).toEqual(full.jobs.map((j) => j.computeSeconds / 2));
  });

  it("generates the published workload with --mix paper", async () => {
    const args = ["--mix", "paper", "--racks", "2", "--hosts-per-rack", "8", "--uplinks", "4", "--jobs", "20", "--systems", "ecmp,spray", "--json"];
    const result = await runCli("simulate", ...args);
    expect(result.code).toBe(0);
    const report = SimulationReportSchema.parse(JSON.parse(result.stdout));
    expect(report.generation?.mix).toBe("paper");
    expect(report.config.queueInMoves).toBe("place");
    expect(report.systems.map((s) => s.jobs)).toEqual([20, 20]);
  });

  it("runs a preset's variants, each with its own settings, and names them in the report", async () => {
    const args = ["--preset", "fig-threshold", "--variants", "lambda-2,lambda-8", "--jobs", "300", "--json"];
    const result = await runCli("simulate", ...args);
    expect(result.code, result.stderr).toBe(0);
    const report = SimulationReportSchema.parse(JSON.parse(result.stdout));
    expect(report.preset).toBe("fig-threshold");
    expect(report.generation?.mix).toBe("paper-dp");
    // A figure preset runs the paper's simulator's way unless a flag says otherwise.
    expect([report.config.queueInMoves, report.config.migrateBy]).toEqual(["hold", "job"]);
    expect(report.variants).toEqual([
      { name: "lambda-2", lambda: 2 },
      { name: "lambda-8", lambda: 8 },
    ]);
    const [tight, loose] = report.systems;
    expect([tight?.variant, loose?.variant]).toEqual(["lambda-2", "lambda-8"]);
    // Four uplinks per rack: a bound of 8 lets racks fragment that a bound of 2 repairs.
    expect(tight!.migrations).toBeGreaterThan(loose!.migrations);
    expect(tight!.fragmentation.meanMaxRack).toBeLessThan(loose!.fragmentation.meanMaxRack);
  });

  it("draws a variant on another cluster size its own traces", async () => {
    const saved = join(dir, "moves-traces");
    mkdirSync(saved);
    const args = ["--preset", "fig-moves", "--variants", "gpus-128,gpus-256", "--loads", "0.9", "--jobs", "30", "--save-trace", saved, "--json"];
    const result = await runCli("simulate", ...args);
    expect(result.code, result.stderr).toBe(0);
    const report = SimulationReportSchema.parse(JSON.parse(result.stdout));
    expect(report.systems.map((s) => s.variant)).toEqual(["gpus-128", "gpus-256"]);
    // Neither is the preset's own 128 hosts.
    expect(readdirSync(saved).sort()).toEqual(["hosts-16-generation.json", "hosts-32-generation.json", "trace-hosts-16-0.9.jsonl", "trace-hosts-32-0.9.jsonl"]);
    expect(JSON.parse(readFileSync(join(saved, "hosts-32-generation.json"), "utf8")).fabric.racks).toBe(4);
  });

  it.each([
    [
      ["--preset", "fig-threshold", "--lambda", "3"],
      /--lambda: the fig-threshold preset sweeps it itself \(variants lambda-2, .*\); pick variants with --variants/,
    ],
    [["--preset", "fig-frontend", "--scheduler", "fifo"], /--scheduler: the fig-frontend preset sweeps it itself/],
    [["--preset", "fig-ep", "--variants", "u3"], /--variants: the fig-ep preset has no variant "u3"; choose from u2, u4, u8, u16/],
    [["--preset", "small", "--variants", "a"], /--variants: the small preset sweeps nothing beside its loads/],
  ])("refuses %j, which a preset's variants decide, with exit code 2", async (args, message) => {
    const result = await runCli("simulate", ...args);
    expect(result.code).toBe(2);
    expect(result.stderr).toMatch(message);
  });

  it.each([
    [["--tokens-per-replica", "0"], /--tokens-per-replica must be a whole number from 1 to 16777216, got "0"/],
    [["--trace", "x.jsonl", "--tokens-per-replica", "4096"], /with --trace the file gives the jobs/],
    [["--racks", "512", "--hosts-per-rack", "64"], /must be at most 16384 hosts/],
    [["--mix", "moe"], /--mix must be one of dp, tp8pp, paper, paper-dp, paper-ep, got "moe"/],
    [["--mix", "paper", "--mean-hours", "3"], /--mean-hours shape the dp and tp8pp mixes; the paper mix's jobs come with their own/],
    [["--mix", "paper", "--racks", "1", "--hosts-per-rack", "4"], /hostCount: the paper mix has jobs of 64 GPUs; give a cluster of at least 8 hosts/],
    [["--queue", "lifo"], /--queue must be one of fifo, backfill, got "lifo"/],
    [["--queue-in-moves", "drop"], /--queue-in-moves must be place or hold, got "drop"/],
    [["--plan-time", "wall"], /--plan-time must be free or solve, got "wall"/],
    [["--migrate-by", "rack"], /--migrate-by must be plan or job, got "rack"/],
    [["--threads", "0"], /--threads must be a whole number from 1 to 1024, got "0"/],
    [["--trace", "x.jsonl", "--slurm-array", "out"], /--slurm-array splits a preset's generated runs by variant and load; a --trace file is one run/],
    [["--plan-time", "solve", "--plan-time-limit", "0"], /--plan-time-limit must be a number from 0.001 to \d+, got "0"/],
    [["--systems", "ecmp,bogus"], /--systems: unknown system "bogus"; choose from ecmp, crux/],
    [["--preset", "nope"], /--preset must be one of paper-1024, /],
    [["--loads", "0.5,1.5"], /each load must be a number in \(0, 1\], got "1.5"/],
    [["--trace", "x.jsonl", "--mix", "dp"], /with --trace the file gives the jobs/],
    [["--from-sacct", "x.json", "--loads", "0.5"], /with --from-sacct the file gives the jobs/],
    [["--trace", "x.jsonl", "--from-sacct", "x.json"], /--trace and --from-sacct both give the jobs; pass one/],
    [["--model", "gpt3-7b"], /--model names the model of jobs read with --from-sacct/],
  ])("refuses %j with exit code 2", async (args, message) => {
    const result = await runCli("simulate", ...args);
    expect(result.code).toBe(2);
    expect(result.stderr).toMatch(message);
  });

  it("names the line and field of a bad trace", async () => {
    const path = join(dir, "bad.jsonl");
    const good = { id: "a", arrival: 0, hostsPerStage: 2, iterations: 3, computeSeconds: 1, ringBytes: 10 };
    writeFileSync(path, `${JSON.stringify(good)}\n\n${JSON.stringify({ ...good, id: "b", hostsPerStage: -1 })}\n`);
    const result = await runCli("simulate", "--trace", path);
    expect(result.code).toBe(2);
    expect(result.stderr).toMatch(new RegExp(`trace ${path} line 3 at hostsPerStage: `));
    writeFileSync(path, "{not json\n");
    expect((await runCli("simulate", "--trace", path)).stderr).toMatch(/line 1: not JSON/);
  });

  it("replays sacct --json output, saving the converted trace, and names the job and field of bad input", async () => {
    const fixture = fileURLToPath(new URL("../sim/fixtures/sacct-22.05.json", import.meta.url));
    const traces = join(dir, "sacct-traces");
    const args = ["simulate", "--from-sacct", fixture, "--racks", "2", "--hosts-per-rack", "4", "--uplinks", "2", "--systems", "ecmp,spray", "--json"];
    const result = await runCli(...args, "--model", "gpt3-13b", "--save-trace", traces);
    expect(result.code).toBe(0);
    expect(result.stderr).toContain("skipped 2 jobs that never ran or held no GPU (slurm-104, slurm-105)");
    const report = SimulationReportSchema.parse(JSON.parse(result.stdout));
    expect(report.systems.map((s) => [s.name, s.load, s.jobs])).toEqual([
      ["ecmp", null, 3],
      ["spray", null, 3],
    ]);
    const saved = readFileSync(join(traces, "trace-sacct.jsonl"), "utf8")
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as { id: string });
    expect(saved.map((job) => job.id)).toEqual(["slurm-101", "slurm-102", "slurm-103"]);

    const bad = await runCli(...args);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain(
      `sacct ${fixture} jobs[1] (job 102) at comment.job: names no model: submit with --comment monkeytree:model=NAME, or pass --model NAME`,
    );
  });
});
