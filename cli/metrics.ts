import type { Registry } from "prom-client";
import { isLoopbackHost, MetricsAddressError, MetricsServer, parseMetricsAddress, type MetricsAddress } from "../controller/metrics/http.ts";
import type { Logger } from "../sdk/contract/log.ts";
import { checked } from "./flags.ts";
import { UsageError, type Io } from "./io.ts";

/** `--metrics ADDR`: where to serve Prometheus metrics, checked before anything starts; null without the flag. */
export const METRICS_FLAG = {
  metrics: checked(
    "ADDR",
    "serve Prometheus metrics at http://ADDR/metrics; ADDR is PORT (on 127.0.0.1) or HOST:PORT, port 0 for any free one. Off by default",
    metricsAddress,
  ),
} as const;

function metricsAddress(raw: string): MetricsAddress {
  try {
    return parseMetricsAddress(raw);
  } catch (error) {
    if (error instanceof MetricsAddressError) throw new UsageError(error.message);
    throw error;
  }
}

/** Starts the scrape endpoint at `at` and says where it listens. */
export async function serveMetrics(at: MetricsAddress, registry: Registry, log: Logger, io: Io): Promise<MetricsServer> {
  if (!isLoopbackHost(at.host))
    log.warn(() => `serving metrics on ${at.host}: anyone who reaches it can read the cluster's placement and migrations; firewall it to your Prometheus`);
  let server;
  try {
    server = await MetricsServer.start(registry, at);
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
  io.out.write(`metrics on http://${server.address}/metrics\n`);
  return server;
}
