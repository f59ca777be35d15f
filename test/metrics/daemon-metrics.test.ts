import { describe, expect, it } from "vitest";
import { DaemonMetrics } from "../../controller/daemon/metrics.ts";

const value = (text: string, series: string): number | undefined => {
  const line = text.split("\n").find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
};

describe("a daemon's metrics", () => {
  it("count verified bytes, rate and duration by transport, transfers by outcome, replacements, and read the staging buffer at each scrape", async () => {
    const metrics = new DaemonMetrics();
    let reserved = 0;
    metrics.attach(() => ({ stagingBytes: 1 << 30, reservedBytes: reserved }));
    metrics.received({ bytes: 4_000_000, seconds: 0.02, transport: "tcp" });
    metrics.received({ bytes: 1_000_000, seconds: 0.5, transport: "tcp" });
    metrics.received({ bytes: 8_000_000, seconds: 0.001, transport: "rdma" });
    metrics.failed("checksum-mismatch");
    metrics.replacementStarted();
    reserved = 4096;
    const text = await metrics.registry.metrics();
    expect(value(text, 'monkeytree_daemon_received_bytes_total{transport="tcp"}')).toBe(5_000_000);
    expect(value(text, 'monkeytree_daemon_received_bytes_total{transport="rdma"}')).toBe(8_000_000);
    expect(value(text, 'monkeytree_daemon_transfer_duration_seconds_sum{transport="tcp"}')).toBeCloseTo(0.52, 9);
    // 200 MB/s and 2 MB/s: one each side of the 30 MB/s bucket bound.
    expect(value(text, 'monkeytree_daemon_transfer_rate_bytes_per_second_bucket{le="30000000",transport="tcp"}')).toBe(1);
    expect(value(text, 'monkeytree_daemon_transfer_rate_bytes_per_second_count{transport="tcp"}')).toBe(2);
    expect(value(text, 'monkeytree_daemon_transfers_total{outcome="verified"}')).toBe(3);
    expect(value(text, 'monkeytree_daemon_transfers_total{outcome="checksum-mismatch"}')).toBe(1);
    expect(value(text, 'monkeytree_daemon_transfers_total{outcome="failed"}')).toBe(0);
    expect(value(text, "monkeytree_daemon_replacements_started_total")).toBe(1);
    expect(value(text, "monkeytree_daemon_staging_size_bytes")).toBe(1 << 30);
    expect(value(text, "monkeytree_daemon_staging_reserved_bytes")).toBe(4096);
  });
});
