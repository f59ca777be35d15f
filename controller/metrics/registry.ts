import { createRequire } from "node:module";
import { Gauge, Registry } from "prom-client";

/**
 * The registry a controller or daemon serves, with what both expose: `monkeytree_build_info`.
 * Every MonkeyTree metric is named `monkeytree_…` in base units (seconds, bytes), counters end
 * in `_total`, and no label names a worker or job: series stay as few as the racks, phases and
 * outcomes, however many workers come and go.
 */

export const PREFIX = "monkeytree_";

const VERSION = (createRequire(import.meta.url)("monkeytree/package.json") as { version: string }).version;

export function createRegistry(role: "controller" | "daemon"): Registry {
  const registry = new Registry();
  const info = new Gauge({
    name: `${PREFIX}build_info`,
    help: "Always 1; its labels name the MonkeyTree version, the Node.js version and the role of the process.",
    labelNames: ["version", "node_version", "role"],
    registers: [registry],
  });
  info.set({ version: VERSION, node_version: process.versions.node, role }, 1);
  return registry;
}

/** Buckets for durations from milliseconds to minutes, in seconds. */
export const SECONDS_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];
/** Buckets for transfer rates, 10 MB/s to 100 GB/s, in bytes per second. */
export const RATE_BUCKETS = [1e7, 3e7, 1e8, 3e8, 1e9, 3e9, 1e10, 3e10, 1e11];
