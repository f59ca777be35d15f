// Metrics overhead: report round trips (`worker.report`, what every launcher sends each second)
// against a controller without metrics (the baseline) and one with them (`--metrics`: the
// observer sees every record, and each scrape reads every job's step from the reports),
// measured in the same run, rounds alternating between the two; then the cost of one scrape.
// Both controllers run in this process, beside their workers, on loopback TCP; the event log
// is on in both, as it always is.
//
//   npm run bench:metrics -- --workers 256 --rounds 20
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { checked, helpText, num, parseCommandFlags } from "../cli/flags.ts";
import { numberFlag, table, UsageError } from "../cli/io.ts";
import { MetricsServer } from "../controller/metrics/http.ts";
import { JOURNAL_FILE } from "../controller/service/journal.ts";
import { ControllerMetrics } from "../controller/service/metrics.ts";
import { ControllerServer } from "../controller/service/server.ts";
import { createLogger } from "../sdk/contract/log.ts";
import { WorkerClient } from "../sdk/client/agent.ts";
import { ControllerClient } from "../sdk/client/client.ts";
import { benchMain } from "./entry.ts";

const JOB_HOSTS = 8;

/** `--workers`: whole jobs, since the workers register in jobs of JOB_HOSTS hosts. */
function wholeJobs(raw: string, name: string): number {
  const workers = numberFlag(name, raw, 0, JOB_HOSTS);
  if (workers % JOB_HOSTS) throw new UsageError(`--${name} must be a multiple of ${JOB_HOSTS} (the job size)`);
  return workers;
}

const FLAGS = {
  workers: checked("N", `registered workers per controller, in jobs of ${JOB_HOSTS}`, wholeJobs, { default: "256" }),
  rounds: num("N", "sequential report rounds per controller", { default: 20, min: 1 }),
  scrapes: num("N", "GET /metrics requests timed", { default: 50, min: 1 }),
};

const help = helpText({
  command: "npm run bench:metrics --",
  table: FLAGS,
  about: `Times report round trips against a controller without metrics and one with them (a
controller's --metrics), in the same run, rounds alternating between the two; then the cost of
one scrape.`,
});

async function start(metrics: ControllerMetrics | null, workers: number) {
  const dir = mkdtempSync(join(tmpdir(), "monkeytree-bench-metrics-"));
  const topology = { racks: Math.ceil(workers / 64), hostsPerRack: 64, gpusPerHost: 8, uplinksPerRack: 32 };
  const server = await ControllerServer.start({
    bind: "tcp://127.0.0.1:*",
    journalDir: dir,
    config: { kind: "config", topology, lambda: topology.uplinksPerRack, podLambda: null },
    transport: { prepare: () => Promise.reject(new Error("no hosts")), release: () => Promise.resolve() },
    launcher: { spawn: () => Promise.reject(new Error("no hosts")) },
    logger: createLogger("controller", () => {}),
    ...(metrics ? { observer: metrics } : {}),
  });
  metrics?.attach(() => ({ ...server.controller.view(), journalPath: join(dir, JOURNAL_FILE) }));
  const clients = Array.from({ length: workers }, () => new ControllerClient({ endpoint: server.endpoint, timeoutMs: 60_000 }));
  const all = clients.map(
    (client, host) => new WorkerClient(client, { job: `job-${Math.floor(host / JOB_HOSTS)}`, group: 0, host }, { tp: 8, pp: 1, dp: JOB_HOSTS }),
  );
  await Promise.all(all.map((w) => w.register(60_000)));
  return {
    workers: all,
    clients,
    stop: async () => {
      for (const w of all) w.close();
      await Promise.all(clients.map((c) => c.close()));
      await server.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

const quantile = (sorted: readonly number[], q: number) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? NaN;

function options(argv: string[]) {
  return parseCommandFlags(argv, FLAGS);
}

await benchMain("metrics", help, options, async ({ workers, rounds, scrapes }) => {
  const metrics = new ControllerMetrics();
  const variants = [
    { name: "without metrics (baseline)", controller: await start(null, workers), samples: [] as number[] },
    { name: "with metrics", controller: await start(metrics, workers), samples: [] as number[] },
  ];
  try {
    const report = (v: (typeof variants)[number], i: number, step: number) =>
      v.controller.clients[i]!.report({ worker: v.controller.workers[i]!.worker, generation: 0, step, stepMs: 25, hold: null });
    // Warm-up, then rounds alternating between the two so drift in the machine's load hits both.
    for (let step = 0; step < 3; step++) for (const v of variants) await Promise.all(v.controller.workers.map((_, i) => report(v, i, step)));
    for (let r = 0, step = 3; r < rounds; r++, step++) {
      for (const v of variants) {
        for (let i = 0; i < v.controller.workers.length; i++) {
          const t = performance.now();
          await report(v, i, step);
          v.samples.push(performance.now() - t);
        }
      }
    }
    const base = [...variants[0]!.samples].sort((a, b) => a - b);
    const rows = variants.map((v) => {
      const sorted = [...v.samples].sort((a, b) => a - b);
      return [
        v.name,
        sorted.length,
        quantile(sorted, 0.5).toFixed(3),
        quantile(sorted, 0.99).toFixed(3),
        (quantile(sorted, 0.5) / quantile(base, 0.5)).toFixed(2),
      ];
    });
    process.stdout.write(
      `report round trips, ${workers} registered workers, one at a time (ms):\n${table(["controller", "samples", "p50", "p99", "p50 ratio"], rows)}\n\n`,
    );

    const scrape = await MetricsServer.start(metrics.registry, { host: "127.0.0.1", port: 0 });
    try {
      const times: number[] = [];
      let bytes = 0;
      for (let i = 0; i < scrapes; i++) {
        const t = performance.now();
        bytes = (await (await fetch(`http://${scrape.address}/metrics`)).arrayBuffer()).byteLength;
        times.push(performance.now() - t);
      }
      times.sort((a, b) => a - b);
      process.stdout.write(
        `GET /metrics with ${workers} workers registered: ${bytes} bytes, p50 ${quantile(times, 0.5).toFixed(2)} ms, p99 ${quantile(times, 0.99).toFixed(2)} ms over ${scrapes} scrapes\n`,
      );
    } finally {
      await scrape.close();
    }
  } finally {
    for (const v of variants) await v.controller.stop();
  }
  return 0;
});
