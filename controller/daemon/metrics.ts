import { Counter, Gauge, Histogram, type Registry } from "prom-client";
import type { TransferResult } from "../../native/index.ts";
import { createRegistry, PREFIX, RATE_BUCKETS, SECONDS_BUCKETS } from "../metrics/registry.ts";

/**
 * A host daemon's Prometheus metrics: checkpoints received by transport, how fast they came,
 * transfers by outcome, replacements started, and its staging buffer's use. Prometheus tells
 * the hosts apart by the target it scraped (`instance`), so no label names the host.
 */

/** What the scrape reads from the daemon. */
export interface DaemonView {
  readonly stagingBytes: number;
  /** Bytes of the buffer granted to moves now. */
  readonly reservedBytes: number;
}

export class DaemonMetrics {
  readonly registry: Registry = createRegistry("daemon");
  private view: (() => DaemonView) | null = null;
  private readonly bytes: Counter;
  private readonly rate: Histogram;
  private readonly seconds: Histogram;
  private readonly transfers: Counter;
  private readonly replacements: Counter;

  constructor() {
    const registers = [this.registry];
    const m = (name: string) => `${PREFIX}daemon_${name}`;
    this.bytes = new Counter({
      name: m("received_bytes_total"),
      help: "Checkpoint bytes received and verified, by transport (tcp, rdma).",
      labelNames: ["transport"],
      registers,
    });
    this.rate = new Histogram({
      name: m("transfer_rate_bytes_per_second"),
      help: "Each verified transfer's rate, by transport.",
      labelNames: ["transport"],
      buckets: RATE_BUCKETS,
      registers,
    });
    this.seconds = new Histogram({
      name: m("transfer_duration_seconds"),
      help: "Each verified transfer's duration, by transport.",
      labelNames: ["transport"],
      buckets: SECONDS_BUCKETS,
      registers,
    });
    this.transfers = new Counter({
      name: m("transfers_total"),
      help: "Transfers into this host by outcome: verified, checksum-mismatch or failed.",
      labelNames: ["outcome"],
      registers,
    });
    for (const outcome of ["verified", "checksum-mismatch", "failed"]) this.transfers.inc({ outcome }, 0);
    this.replacements = new Counter({ name: m("replacements_started_total"), help: "Replacement launchers this daemon started.", registers });
    const staging: Gauge = new Gauge({
      name: m("staging_size_bytes"),
      help: "Size of the host's staging buffer.",
      registers,
      collect: () => this.read((v) => staging.set(v.stagingBytes)),
    });
    const reserved: Gauge = new Gauge({
      name: m("staging_reserved_bytes"),
      help: "Bytes of the staging buffer granted to moves now.",
      registers,
      collect: () => this.read((v) => reserved.set(v.reservedBytes)),
    });
  }

  private read(set: (view: DaemonView) => void): void {
    if (this.view) set(this.view());
  }

  attach(view: () => DaemonView): void {
    this.view = view;
  }

  received(result: TransferResult): void {
    const labels = { transport: result.transport };
    this.bytes.inc(labels, result.bytes);
    this.seconds.observe(labels, result.seconds);
    if (result.seconds > 0) this.rate.observe(labels, result.bytes / result.seconds);
    this.transfers.inc({ outcome: "verified" });
  }

  failed(outcome: "checksum-mismatch" | "failed"): void {
    this.transfers.inc({ outcome });
  }

  replacementStarted(): void {
    this.replacements.inc();
  }
}
