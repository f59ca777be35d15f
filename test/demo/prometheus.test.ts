import { spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runDemo, type DemoResult } from "../../cli/demo/run.ts";
import { freePort } from "../helpers/net.ts";
import { canRun, prometheus } from "../helpers/prerequisites.ts";
import { SAFETY_NET_MS } from "../helpers/wait.ts";

/**
 * Debian's real Prometheus scrapes the demo's controller and daemons (found through the
 * file_sd targets the demo writes), and what it stored must equal what the demo reports:
 * moves by outcome, time in each migration phase, fragmentation, bytes moved by transport.
 */

const runs = canRun("the Prometheus scrape of the demo", prometheus());

interface Sample {
  readonly metric: Record<string, string>;
  readonly value: number;
}

let dir = "";
let server: ChildProcess | undefined;
let base = "";
let keep = false;

async function query(promql: string): Promise<Sample[]> {
  const response = await fetch(`${base}/api/v1/query?query=${encodeURIComponent(promql)}`);
  const body = (await response.json()) as { status: string; error?: string; data: { result: { metric: Record<string, string>; value: [number, string] }[] } };
  if (body.status !== "success") throw new Error(`${promql}: ${body.error ?? body.status}`);
  return body.data.result.map((r) => ({ metric: r.metric, value: Number(r.value[1]) }));
}

/** Polls until `check` holds; the timeout is only a safety net. */
async function until(what: string, check: () => Promise<boolean>, timeoutMs = SAFETY_NET_MS): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check().catch(() => false))) {
    if (Date.now() > deadline) throw new Error(`gave up waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

const byLabel = (samples: readonly Sample[], label: string): Record<string, number> => Object.fromEntries(samples.map((s) => [s.metric[label] ?? "", s.value]));

describe.runIf(runs)("Prometheus scraping the demo", () => {
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "monkeytree-prometheus-"));
    const targets = join(dir, "targets.json");
    writeFileSync(targets, "[]");
    // JSON is YAML: the scrape config, with an interval short enough for a demo of seconds, and
    // a timeout that a target's answer on a loaded machine meets: a failed scrape marks its
    // series stale, and the queries below would miss them.
    const config = join(dir, "prometheus.yml");
    writeFileSync(
      config,
      JSON.stringify({
        scrape_configs: [
          { job_name: "monkeytree", scrape_interval: "2s", scrape_timeout: "2s", file_sd_configs: [{ files: [targets], refresh_interval: "1s" }] },
        ],
      }),
    );
    mkdirSync(join(dir, "data"));
    const port = await freePort();
    base = `http://127.0.0.1:${port}`;
    server = spawn(
      "prometheus",
      [`--config.file=${config}`, `--storage.tsdb.path=${join(dir, "data")}`, `--web.listen-address=127.0.0.1:${port}`, "--log.level=warn"],
      { stdio: ["ignore", "ignore", "pipe"] },
    );
    let stderr = "";
    server.stderr?.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    const exited = new Promise<never>((_, reject) => server?.once("exit", (code) => reject(new Error(`prometheus exited (${code}): ${stderr}`))));
    await Promise.race([until("prometheus to be ready", async () => (await fetch(`${base}/-/ready`)).ok), exited]);
  }, 150_000);

  afterAll(async () => {
    if (server && server.exitCode === null) {
      const gone = new Promise((resolve) => server?.once("exit", resolve));
      server.kill("SIGTERM");
      await gone;
    }
    if (dir && !keep) rmSync(dir, { recursive: true, force: true });
  });

  it("stores what the demo reports: moves by outcome, phase times, fragmentation, bytes by transport", async () => {
    const lines: string[] = [];
    const scraped = {
      outcomes: {} as Record<string, number>,
      phaseCount: {} as Record<string, number>,
      phaseSum: {} as Record<string, number>,
      atPlan: {} as Record<string, number>,
      now: {} as Record<string, number>,
      bytes: {} as Record<string, number>,
      up: 0,
    };
    // A directory of its own, as `monkeytree demo` makes: replacements run as another user when this runs as root, and must reach it.
    const demoDir = mkdtempSync(join(tmpdir(), "monkeytree-demo-"));
    const result: DemoResult = await runDemo({
      dir: demoDir,
      stateBytes: 4 * 2 ** 20,
      steps: 16,
      stepMs: 60,
      timeoutMs: SAFETY_NET_MS,
      print: (line) => lines.push(line),
      metrics: {
        targets: join(dir, "targets.json"),
        // The demo has ended: wait for a scrape of every target taken after this moment.
        inspect: async () => {
          const ended = Date.now() / 1000;
          const upNow = async () => (await query("sum(up)"))[0]?.value ?? 0;
          await until(
            "a scrape of the controller and all 8 daemons after the demo's end, all of them up",
            async () => (await query(`count(timestamp(monkeytree_build_info) > ${ended})`))[0]?.value === 9 && (await upNow()) === 9,
          );
          scraped.up = await upNow();
          scraped.outcomes = byLabel(await query("sum by (outcome) (monkeytree_migrations_total)"), "outcome");
          scraped.phaseCount = byLabel(await query("sum by (phase) (monkeytree_migration_phase_duration_seconds_count)"), "phase");
          scraped.phaseSum = byLabel(await query("sum by (phase) (monkeytree_migration_phase_duration_seconds_sum)"), "phase");
          scraped.atPlan = byLabel(await query("monkeytree_rack_fragmentation_at_last_plan"), "rack");
          scraped.now = byLabel(await query("monkeytree_rack_fragmentation"), "rack");
          scraped.bytes = byLabel(await query("sum by (transport) (monkeytree_daemon_received_bytes_total)"), "transport");
        },
      },
    }).catch((error: unknown) => {
      // The demo's own account of how far it got, and its logs, say why.
      keep = true;
      throw new Error(`${(error as Error).message}; logs in ${demoDir}\n${lines.join("\n")}`);
    });
    rmSync(demoDir, { recursive: true, force: true });
    expect(result.ok, lines.join("\n")).toBe(true);
    expect(scraped.up).toBe(9);

    // Moves by outcome: the demo's two swaps, both done.
    const outcomes = { done: 0, "rolled-back": 0 };
    for (const m of result.migrations) outcomes[m.state as keyof typeof outcomes]++;
    expect(outcomes.done).toBe(2);
    expect(scraped.outcomes).toEqual(outcomes);

    // Each phase's histogram: one sample per move that left it, summing the times the demo's phase table shows.
    const count: Record<string, number> = {};
    const sum: Record<string, number> = {};
    for (const m of result.migrations) {
      for (const [i, entry] of m.history.slice(0, -1).entries()) {
        count[entry.state] = (count[entry.state] ?? 0) + 1;
        sum[entry.state] = (sum[entry.state] ?? 0) + (m.history[i + 1]!.at - entry.at) / 1000;
      }
    }
    expect(count.transferring).toBe(2);
    expect(Object.fromEntries(Object.entries(scraped.phaseCount).filter(([, n]) => n > 0))).toEqual(count);
    for (const [phase, seconds] of Object.entries(sum)) expect(scraped.phaseSum[phase], phase).toBeCloseTo(seconds, 6);

    // Fragmentation: the racks the arrival broke (16, 16, 0, 8 on a bound of 8) triggered the plan; at the end every job has finished.
    const racks = (degrees: readonly number[]) => Object.fromEntries(degrees.map((d, rack) => [String(rack), d]));
    expect(result.arrival).toEqual([16, 16, 0, 8]);
    expect(scraped.atPlan).toEqual(racks(result.arrival));
    expect(scraped.now).toEqual(racks(result.final));

    // Bytes moved, by the transport the sources used.
    const sent: Record<string, number> = {};
    for (const t of result.transfers) sent[t.transport] = (sent[t.transport] ?? 0) + t.bytes;
    expect(result.transfers).toHaveLength(2);
    expect(scraped.bytes).toEqual(sent);
  }, 400_000);
});
