import { readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { WorkerClient } from "../../sdk/client/agent.ts";
import { ControllerEventSchema, type ControllerEvent } from "../../sdk/contract/protocol/events.ts";
import { EVENT_LOG_FILE } from "../../controller/service/event-log.ts";
import { JOURNAL_FILE } from "../../controller/service/journal.ts";
import { ControllerMetrics } from "../../controller/service/metrics.ts";
import { patiently, SAFETY_NET_MS } from "../helpers/wait.ts";
import { closeControllersAfterEach, connect, INCARNATION, plannedMoves, startController, type Harness } from "./harness.ts";

/**
 * The controller's metrics and event log, watching a real controller service: two jobs that
 * break the bound, a plan, a move whose checkpoint arrives damaged and rolls back.
 */

let harness: Harness | undefined;
closeControllersAfterEach();

const dp2 = { tp: 1, pp: 1, dp: 2 };

/** The value of one series in Prometheus text, or undefined when it is not there. */
function value(text: string, series: string): number | undefined {
  const line = text.split("\n").find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

/** Runs the scenario and returns the metrics, the client and the rolled-back move. */
async function rolledBackMove() {
  const metrics = new ControllerMetrics();
  harness = await startController({ overrides: { observer: metrics } });
  const h = harness;
  metrics.attach(() => ({ ...h.server.controller.view(), journalPath: join(h.dir, JOURNAL_FILE) }));
  const client = connect(h);
  const start = async (job: string, hosts: number[]) => {
    // Frequent reports, so the job's progress shows in the metrics soon after it trains.
    const workers = hosts.map(
      (host) => new WorkerClient(client, { job, group: 0, host }, dp2, { checkpointBytes: 1 << 20, holdTimeoutMs: 10_000, reportIntervalMs: 50 }),
    );
    await Promise.all(workers.map((w) => w.register(5_000)));
    return workers;
  };
  const a = await start("a", [0, 4]);
  const b = await start("b", [1, 5]);
  const move = (await plannedMoves(client))[0]!;
  const moving = move.job === "a" ? a : b;
  const source = moving.find((w) => w.worker.host === move.from)!;
  const stayer = moving.find((w) => w.worker.host !== move.from)!;
  // The workers hold at the stop once they know of it.
  await expect.poll(() => moving.every((w) => w.stop !== null), { timeout: 10_000 }).toBe(true);
  const step = source.stop!.step;
  const held = stayer.barrier(step);
  expect((await source.barrier(step)).kind).toBe("migrate-out");
  const verdict = source.barrier(step);
  await client.request({ type: "daemon.register", host: move.to, incarnation: INCARNATION, stagingBytes: 1 << 30, endpoint: "tcp://127.0.0.1:1" });
  await client.request({
    type: "daemon.transfer-result",
    host: move.to,
    token: `token-${move.id}`,
    bytes: 1 << 20,
    outcome: "checksum-mismatch",
    detail: "crc32c 0x1 != 0x2",
  });
  expect(await verdict).toEqual({ kind: "continue" });
  expect(await held).toEqual({ kind: "continue" });
  return { metrics, client, move, h, step, other: move.job === "a" ? b : a };
}

// The scenario waits for its controller's first plan, and so for a planner thread to start.
describe("controller metrics", { timeout: SAFETY_NET_MS }, () => {
  it("count the plan, the move's phases and outcome, read placement, the jobs' progress and the journal at each scrape", async () => {
    const { metrics, client, move, step, other } = await rolledBackMove();
    // The job that did not move trains a few steps; its workers report them.
    const otherJob = other[0]!.worker.job;
    for (let s = 0; s < 4; s++) expect(await Promise.all(other.map((w) => w.barrier(s)))).toEqual([{ kind: "continue" }, { kind: "continue" }]);
    await expect.poll(async () => value(await metrics.registry.metrics(), `monkeytree_job_step{job="${otherJob}"}`), { timeout: 10_000 }).toBe(3);
    const text = await metrics.registry.metrics();
    expect(value(text, "monkeytree_defragmentation_events_total")).toBe(1);
    expect(value(text, 'monkeytree_plans_total{status="optimal"}')).toBe(1);
    expect(value(text, "monkeytree_plan_moves_count")).toBe(1);
    expect(value(text, "monkeytree_plan_moves_sum")).toBe(1);
    expect(value(text, "monkeytree_plan_duration_seconds_count")).toBe(1);
    // Both racks carried two rings on one uplink when the plan was made.
    expect(value(text, 'monkeytree_rack_fragmentation_at_last_plan{rack="0"}')).toBe(2);
    expect(value(text, 'monkeytree_rack_fragmentation_at_last_plan{rack="1"}')).toBe(2);
    // The move rolled back, so the racks are still over: the gauges read the state now.
    expect(value(text, 'monkeytree_rack_fragmentation{rack="0"}')).toBe(2);
    expect(value(text, 'monkeytree_rack_fragmentation_bound{rack="0"}')).toBe(1);
    expect(value(text, "monkeytree_racks_over_bound")).toBe(2);
    expect(value(text, 'monkeytree_migrations_total{outcome="rolled-back"}')).toBe(1);
    expect(value(text, 'monkeytree_migrations_total{outcome="done"}')).toBe(0);
    const status = (await client.status()).migrations.find((m) => m.id === move.id)!;
    // One sample per phase the move left, each its time in the journaled history.
    for (const [i, entry] of status.history.slice(0, -1).entries()) {
      expect(value(text, `monkeytree_migration_phase_duration_seconds_count{phase="${entry.state}"}`), entry.state).toBe(1);
      expect(value(text, `monkeytree_migration_phase_duration_seconds_sum{phase="${entry.state}"}`)).toBeCloseTo(
        (status.history[i + 1]!.at - entry.at) / 1000,
        9,
      );
    }
    expect(value(text, 'monkeytree_migration_phase_duration_seconds_count{phase="verifying"}')).toBe(1);
    expect(value(text, "monkeytree_migration_verified_bytes_total")).toBe(0);
    expect(value(text, 'monkeytree_registered_jobs{state="running"}')).toBe(2);
    expect(value(text, "monkeytree_registered_workers")).toBe(4);
    expect(value(text, 'monkeytree_registered_daemons{state="live"}')).toBe(1);
    expect(value(text, "monkeytree_plan_in_progress")).toBe(0);
    // Each job's progress, as its workers reported it: the moving job reached its stop step and
    // timed no step; the other trained steps 0 to 3, and reports their median time.
    expect(text).not.toContain("monkeytree_barrier_latency_seconds");
    expect(value(text, `monkeytree_job_step{job="${move.job}"}`)).toBe(step);
    expect(value(text, `monkeytree_job_step_seconds{job="${move.job}"}`)).toBeUndefined();
    expect(value(text, `monkeytree_job_step_seconds{job="${otherJob}"}`)).toBeGreaterThanOrEqual(0);
    expect(value(text, "monkeytree_journal_size_bytes")).toBe(statSync(join(harness!.dir, JOURNAL_FILE)).size);
    expect(text).toMatch(/^monkeytree_build_info\{version="\d+\.\d+\.\d+",node_version="[\d.]+",role="controller"\} 1$/m);
    // Prometheus naming: one prefix, counters in _total, no label naming a worker, host or
    // migration; only the per-job progress gauges name a job.
    const names = [...text.matchAll(/^# TYPE (\S+) (\S+)$/gm)].map((m) => ({ name: m[1]!, type: m[2]! }));
    for (const { name, type } of names) {
      expect(name).toMatch(/^monkeytree_/);
      if (type === "counter") expect(name).toMatch(/_total$/);
    }
    expect(text).not.toMatch(/\{[^}]*\b(host|worker|migration)=/);
    const jobLabelled = new Set([...text.matchAll(/^(\w+)\{[^}]*\bjob=/gm)].map((m) => m[1]));
    expect(jobLabelled).toEqual(new Set(["monkeytree_job_step", "monkeytree_job_step_seconds"]));
  });
});

describe("the controller's event log", { timeout: SAFETY_NET_MS }, () => {
  it("writes every decision as one schema-valid JSON line beside the journal, and serves them to events requests", async () => {
    const { client, move, h } = await rolledBackMove();
    const lines = readFileSync(join(h.dir, EVENT_LOG_FILE), "utf8").trim().split("\n");
    const events = lines.map((line) => ControllerEventSchema.parse(JSON.parse(line)));
    expect(events.map((e) => e.seq)).toEqual(events.map((_, i) => i + 1));
    const kinds = events.map((e) => e.event);
    expect(kinds.slice(0, 4)).toEqual(["job-started", "job-started", "fragmentation", "plan"]);
    expect(events[2]).toMatchObject({ event: "fragmentation", racks: [2, 2], lambda: 1, over: [0, 1] });
    expect(events[3]).toMatchObject({ event: "plan", plan: "p0", status: "optimal", moves: 1, steps: 1 });
    const moves = events.filter((e): e is Extract<ControllerEvent, { event: "move" }> => e.event === "move");
    expect(moves.map((e) => `${e.from}→${e.to}`)).toEqual([
      "planned→staging",
      "staging→ready",
      "ready→pausing",
      "pausing→transferring",
      "transferring→verifying",
      "verifying→rolled-back",
    ]);
    expect(moves[0]).toMatchObject({ migration: move.id, job: move.job, source: move.from, destination: move.to });
    expect(events.at(-1)).toMatchObject({ event: "rollback", migration: move.id, reason: expect.stringContaining("checksum mismatch: crc32c 0x1 != 0x2") });

    // A follower starts with the latest few, then gets what follows its cursor.
    const tail = await client.events();
    expect(tail.events.map((e) => e.seq)).toEqual(events.slice(-10).map((e) => e.seq));
    expect(tail.last).toBe(events.length);
    const all = await client.events(0);
    expect(all.events).toEqual(events);
    expect((await client.events(events.length)).events).toEqual([]);

    // Numbers go on across a restart: the new controller reads the last one from the file.
    await client.close();
    harness = await h.restart();
    const again = connect(harness);
    const other = move.job === "a" ? "b" : "a";
    await again.finish(other);
    const after = await again.events(events.length);
    expect(after.events).toEqual([expect.objectContaining({ seq: events.length + 1, event: "job-finished", job: other })]);
  });

  it("tells of a daemon lost, in the log and in the metrics", async () => {
    const metrics = new ControllerMetrics();
    harness = await startController({ overrides: { observer: metrics, heartbeatTimeoutMs: 300 } });
    const h = harness;
    metrics.attach(() => ({ ...h.server.controller.view(), journalPath: join(h.dir, JOURNAL_FILE) }));
    const client = connect(h);
    await client.request({ type: "daemon.register", host: 3, incarnation: INCARNATION, stagingBytes: 1 << 20, endpoint: "tcp://127.0.0.1:1" });
    // No heartbeats follow: the daemon is lost once the timeout has passed.
    const lostEvent = async () => (await client.events(0)).events.find((e) => e.event === "daemon-lost");
    await expect.poll(lostEvent, { ...patiently, interval: 50 }).toBeDefined();
    const lost = await lostEvent();
    expect(lost).toMatchObject({ event: "daemon-lost", host: 3, silentMs: expect.any(Number) });
    expect((lost as Extract<ControllerEvent, { event: "daemon-lost" }>).silentMs).toBeGreaterThanOrEqual(300);
    const text = await metrics.registry.metrics();
    expect(value(text, "monkeytree_daemons_lost_total")).toBe(1);
    expect(value(text, 'monkeytree_registered_daemons{state="lost"}')).toBe(1);
    expect(value(text, 'monkeytree_registered_daemons{state="live"}')).toBe(0);
  });
});
