import { statSync } from "node:fs";
import { Counter, Gauge, Histogram, type Registry } from "prom-client";
import { rackFragmentation } from "../planner/model/fragmentation.ts";
import { createRegistry, PREFIX, SECONDS_BUCKETS } from "../metrics/registry.ts";
import { PLAN_STATUSES } from "../../sdk/contract/protocol/events.ts";
import { isFinished, MIGRATION_STATES } from "./migration.ts";
import type { ControllerObserver, PlanOutcome } from "./observer.ts";
import { clusterOf, type DurableState, type JournalRecord } from "./state.ts";
import type { JobProgress, LiveView } from "./status.ts";

/**
 * The controller's Prometheus metrics. Counters and histograms follow the journal as its
 * records are applied (a move's phases come from the times its states were entered, the
 * same times `monkeytree status` shows); gauges of what the controller holds now (placement,
 * connections, the journal's size) are read at each scrape. They start from zero with each
 * controller process, as Prometheus counters do: `rate()` and `increase()` count across the
 * reset, and the compacted journal no longer holds the history a rebuilt count would need
 * (docs/monitoring.md).
 */

/** What the scrape reads from the running controller: what `status` reports, and where its journal is. */
export type ControllerView = LiveView & { readonly journalPath: string };

export class ControllerMetrics implements ControllerObserver {
  readonly registry: Registry = createRegistry("controller");
  private view: (() => ControllerView) | null = null;
  private readonly atPlan: Gauge;
  private readonly defragmentations: Counter;
  private readonly plans: Counter;
  private readonly planFailures: Counter;
  private readonly planSeconds: Histogram;
  private readonly planMoves: Histogram;
  private readonly migrations: Counter;
  private readonly phaseSeconds: Histogram;
  private readonly bytesMoved: Counter;
  private readonly daemonsLost: Counter;

  constructor() {
    const registers = [this.registry];
    const m = (name: string) => `${PREFIX}${name}`;
    this.atPlan = new Gauge({
      name: m("rack_fragmentation_at_last_plan"),
      help: "Each rack's fragmentation degree when the controller last planned moves.",
      labelNames: ["rack"],
      registers,
    });
    this.defragmentations = new Counter({
      name: m("defragmentation_events_total"),
      help: "Times some rack was found over its bound and the planner was asked for moves.",
      registers,
    });
    this.plans = new Counter({ name: m("plans_total"), help: "Plans by the planner's status.", labelNames: ["status"], registers });
    for (const status of PLAN_STATUSES) this.plans.inc({ status }, 0);
    this.planFailures = new Counter({ name: m("plan_failures_total"), help: "Planner calls that failed (tried again later).", registers });
    this.planSeconds = new Histogram({ name: m("plan_duration_seconds"), help: "Time the planner took per plan.", buckets: SECONDS_BUCKETS, registers });
    this.planMoves = new Histogram({ name: m("plan_moves"), help: "Moves per plan.", buckets: [0, 1, 2, 4, 8, 16, 32, 64, 128], registers });
    this.migrations = new Counter({
      name: m("migrations_total"),
      help: "Finished moves by outcome: done, or rolled-back.",
      labelNames: ["outcome"],
      registers,
    });
    for (const outcome of ["done", "rolled-back"]) this.migrations.inc({ outcome }, 0);
    this.phaseSeconds = new Histogram({
      name: m("migration_phase_duration_seconds"),
      help: "Time moves spent in each state of the migration state machine, counted as they leave it.",
      labelNames: ["phase"],
      buckets: SECONDS_BUCKETS,
      registers,
    });
    this.bytesMoved = new Counter({
      name: m("migration_verified_bytes_total"),
      help: "Checkpoint bytes destinations received and verified (by transport: the daemons' monkeytree_daemon_received_bytes_total).",
      registers,
    });
    this.daemonsLost = new Counter({ name: m("daemons_lost_total"), help: "Times a host daemon was declared lost (heartbeats missed).", registers });
    this.clusterGauges();
    this.connectionGauges();
  }

  /** Read at each scrape, from the view the controller hands `attach`. */
  private read<T>(get: (view: ControllerView) => T, set: (value: T) => void): () => void {
    return () => {
      if (this.view) set(get(this.view()));
    };
  }

  /** The racks' fragmentation against their bound, and the moves in flight, at each scrape. */
  private clusterGauges(): void {
    const registers = [this.registry];
    const m = (name: string) => `${PREFIX}${name}`;
    const read = this.read.bind(this);
    const fragmentation = new Gauge({
      name: m("rack_fragmentation"),
      help: "Each rack's fragmentation degree: the rings of the groups it shares with other racks.",
      labelNames: ["rack"],
      registers,
      collect: read(
        (v) => rackFragmentation(clusterOf(v.state)),
        (degrees) => degrees.forEach((d, rack) => fragmentation.set({ rack }, d)),
      ),
    });
    const bound = new Gauge({
      name: m("rack_fragmentation_bound"),
      help: "Each rack's bound on its fragmentation degree (λ, its uplinks by default).",
      labelNames: ["rack"],
      registers,
      collect: read(
        (v) => v.state,
        (s) => {
          for (let rack = 0; rack < s.topology.racks; rack++) bound.set({ rack }, s.lambda);
        },
      ),
    });
    const over = new Gauge({
      name: m("racks_over_bound"),
      help: "Racks whose fragmentation degree is over their bound now.",
      registers,
      collect: read(
        (v) => rackFragmentation(clusterOf(v.state)).filter((d) => d > v.state.lambda).length,
        (n) => over.set(n),
      ),
    });
    const inProgress = new Gauge({
      name: m("plan_in_progress"),
      help: "1 while a plan has moves in flight, else 0.",
      registers,
      collect: read(
        (v) =>
          v.state.activeMoves.some((id) => {
            const mv = v.state.migrations.get(id);
            return mv !== undefined && !isFinished(mv.state);
          }),
        (b) => inProgress.set(b ? 1 : 0),
      ),
    });
    const inFlight = new Gauge({
      name: m("migrations_in_flight"),
      help: "Moves of the active plan by state, finished ones excluded.",
      labelNames: ["state"],
      registers,
      collect: read(
        (v) => v.state,
        (s) => {
          for (const state of MIGRATION_STATES) if (!isFinished(state)) inFlight.set({ state }, 0);
          for (const id of s.activeMoves) {
            const mv = s.migrations.get(id);
            if (mv && !isFinished(mv.state)) inFlight.inc({ state: mv.state });
          }
        },
      ),
    });
  }

  /** The workers, daemons and jobs connected, each job's progress, and the journal's size, at each scrape. */
  private connectionGauges(): void {
    const registers = [this.registry];
    const m = (name: string) => `${PREFIX}${name}`;
    const read = this.read.bind(this);
    const workers = new Gauge({
      name: m("registered_workers"),
      help: "Workers connected to the controller (registered launchers).",
      registers,
      collect: read(
        (v) => v.workers,
        (n) => workers.set(n),
      ),
    });
    const daemons = new Gauge({
      name: m("registered_daemons"),
      help: "Host daemons registered with the controller, live or lost.",
      labelNames: ["state"],
      registers,
      collect: read(
        (v) => v.daemons,
        (d) => {
          daemons.set({ state: "live" }, d.filter((x) => !x.lost).length);
          daemons.set({ state: "lost" }, d.filter((x) => x.lost).length);
        },
      ),
    });
    const jobs = new Gauge({
      name: m("registered_jobs"),
      help: "Jobs running, and jobs still waiting for some of their workers to register.",
      labelNames: ["state"],
      registers,
      collect: read(
        (v) => v,
        (v) => {
          jobs.set({ state: "running" }, v.state.jobs.size);
          jobs.set({ state: "registering" }, v.registering.length);
        },
      ),
    });
    // A job's progress, from its launchers' reports; a finished job's series go with it.
    const perJob = (name: string, help: string, get: (p: JobProgress) => number | null) => {
      const gauge: Gauge = new Gauge({
        name: m(name),
        help,
        labelNames: ["job"],
        registers,
        collect: read(
          (v) => v.progress,
          (progress) => {
            gauge.reset();
            for (const [job, p] of progress) {
              const value = get(p);
              if (value !== null) gauge.set({ job }, value);
            }
          },
        ),
      });
    };
    perJob("job_step", "Each running job's last barrier step, as its launchers report it.", (p) => p.step);
    perJob("job_step_seconds", "Each running job's recent step time: the median its slowest host reports.", (p) => p.stepSeconds);
    const journal = new Gauge({
      name: m("journal_size_bytes"),
      help: "Size of the journal file.",
      registers,
      collect: read(
        (v) => v.journalPath,
        (path) => journal.set(fileSize(path)),
      ),
    });
  }

  /** Where the scrape reads the controller's state and connections from. */
  attach(view: () => ControllerView): void {
    this.view = view;
  }

  applied(before: DurableState, record: JournalRecord): void {
    if (record.kind !== "migration") return;
    const m = record.migration;
    const was = before.migrations.get(m.id);
    if (!was || was.state === m.state) return;
    this.phaseSeconds.observe({ phase: was.state }, (m.since - was.since) / 1000);
    if (was.state === "verifying" && m.state === "staged") this.bytesMoved.inc(m.bytes);
    if (isFinished(m.state)) this.migrations.inc({ outcome: m.state });
  }

  planned(outcome: PlanOutcome): void {
    this.defragmentations.inc();
    this.plans.inc({ status: outcome.status });
    this.planSeconds.observe(outcome.seconds);
    this.planMoves.observe(outcome.moves);
    outcome.fragmentation.forEach((d, rack) => this.atPlan.set({ rack }, d));
  }

  planFailed(): void {
    this.defragmentations.inc();
    this.planFailures.inc();
  }

  daemonLost(): void {
    this.daemonsLost.inc();
  }

  // Status and the event log report lost workers; no metric counts them.
  workerLost(): void {}
}

function fileSize(path: string): number {
  try {
    return statSync(path).size;
  } catch {
    return 0;
  }
}
