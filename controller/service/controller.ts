import { errorReply, ProtocolError } from "../../sdk/contract/protocol/errors.ts";
import type { Request } from "../../sdk/contract/protocol/codec.ts";
import { createLogger, type Logger } from "../../sdk/contract/log.ts";
import { authorize, type Caller } from "./authorization.ts";
import { ControllerContext, type Outgoing, type ReplyTarget } from "./context.ts";
import { PlanExecution } from "./execution.ts";
import { EventLog } from "./event-log.ts";
import type { Journal } from "./journal.ts";
import { Vouches } from "./vouches.ts";
import { DaemonLiveness } from "./liveness.ts";
import { DEFAULT_PLAN_TIME_LIMIT_MS, PlanThread, type PlanRunner } from "./plan-thread.ts";
import { assertNever, DEFAULT_TIMEOUTS, type MigrationTimeouts } from "./migration.ts";
import { observeAll, type ControllerObserver } from "./observer.ts";
import { DEFAULT_LOST_JOB_GRACE_MS, DEFAULT_WORKER_HEARTBEAT_TIMEOUT_MS, WorkerSessions } from "./sessions.ts";
import type { DurableState } from "./state.ts";
import { SchedulerWatch } from "./scheduler-watch.ts";
import { statusReport, type LiveView } from "./status.ts";
import type { HostScheduler, ReplacementLauncher, StagingTransport } from "./transport.ts";

/**
 * The controller's logic, free of sockets: requests come in through `handle`, and `drain`
 * makes the journal durable and then hands back the replies to send. It owns the
 * journal-backed state (`ControllerContext`) and dispatches each request to the part that
 * handles it: worker sessions (`sessions.ts`), daemon liveness (`liveness.ts`) or plan
 * execution (`execution.ts`). Effects on other hosts (staging, spawning) run only after the
 * journal records that led to them are on disk.
 */

export interface ControllerOptions {
  readonly journal: Journal;
  /**
   * Steps a job still trains after its move starts, before all its workers stop together
   * (default 0). The destination's replacement launcher starts when the move does; a lead
   * hides its start when that takes longer than the rest of the current step and the transfer.
   */
  readonly stopLeadSteps?: number;
  /** Compact the journal once it holds this many records (default 50,000). */
  readonly compactAfterRecords?: number;
  /** Or once this many bytes of records were appended since the last compaction (default 32 MiB). */
  readonly compactAfterBytes?: number;
  /** State replayed from `journal`. */
  readonly state: DurableState;
  /** Where plans are computed; by default a `PlanThread`, off the event loop. */
  readonly planner?: PlanRunner;
  readonly transport: StagingTransport;
  readonly launcher: ReplacementLauncher;
  /**
   * Take a new worker only on a host whose daemon vouched for a launcher of its job (`daemon.vouch`,
   * asked over the host's local socket), so a job credential claims only hosts its job runs on.
   */
  readonly requireVouch?: boolean;
  /** The local user a job's replacements run as, where the operator named one (its keyring entry's). */
  readonly jobUser?: (job: string) => string | null;
  /** The scheduler that owns the hosts (Slurm), if one does. */
  readonly scheduler?: HostScheduler;
  /** Hosts that never take a worker, whatever the scheduler says: the empty slots of short racks. */
  readonly unavailable?: readonly number[];
  /** How often to look at the scheduler's view of the cluster (default 3 s). */
  readonly schedulerPollMs?: number;
  readonly clock?: () => number;
  readonly logger?: Logger;
  readonly timeouts?: MigrationTimeouts;
  readonly planTimeLimitMs?: number;
  /** A daemon silent for this long is declared lost. */
  readonly heartbeatTimeoutMs?: number;
  /** A worker whose launcher heartbeats and is silent for this long is lost (default 10 s). */
  readonly workerHeartbeatTimeoutMs?: number;
  /**
   * A job whose every worker is lost is ended this much later (default 60 s): its launchers
   * are gone, so nothing else would ever report its end and free its hosts.
   */
  readonly lostJobGraceMs?: number;
  /**
   * After a plan rolls back, or after a restart, plan again this much later: soon enough to
   * end congestion, late enough that a cause that persists (a dead host) does not pause
   * jobs over and over.
   */
  readonly replanBackoffMs?: number;
  /**
   * Told of every daemon registration the controller accepted, with the routing identity and
   * transfer endpoint it came from: the only place a host's command route is recorded.
   */
  readonly daemonRegistered?: (host: number, peer: Uint8Array, endpoint: string) => void;
  /** Where decisions are written and served to `events` requests; default: in memory only. */
  readonly eventLog?: EventLog;
  /** Told of every decision besides the event log (the metrics). */
  readonly observer?: ControllerObserver;
}

export const DEFAULT_HEARTBEAT_TIMEOUT_MS = 10_000;
export const DEFAULT_REPLAN_BACKOFF_MS = 30_000;
/** A scheduler's changes (a job starting, a node drained) reach the plan within this. */
export const DEFAULT_SCHEDULER_POLL_MS = 3_000;
/** Steps a job trains between the start of its move and its stop barrier. */
export const DEFAULT_STOP_LEAD_STEPS = 0;
/** The journal is rewritten as one snapshot once it holds this many records. */
export const DEFAULT_COMPACT_AFTER_RECORDS = 50_000;
/** Or once this many bytes of records follow the last snapshot, however few records that is. */
export const DEFAULT_COMPACT_AFTER_BYTES = 32 * 2 ** 20;

export class Controller {
  private readonly context: ControllerContext;
  private readonly log: Logger;
  private readonly daemons: DaemonLiveness;
  private readonly sessions: WorkerSessions;
  private readonly vouches = new Vouches();
  private readonly plan: PlanExecution;
  private readonly watch: SchedulerWatch | null;
  private readonly events: EventLog;
  /** Called whenever there is something to drain: the server schedules a drain. */
  onWork: () => void = () => {};
  // Made once: `handle` and `drain` run them for every message.
  private readonly drive = () => this.plan.drive();
  private readonly replanIfWanted = () => this.plan.replanIfWanted();

  constructor(options: ControllerOptions) {
    this.log = options.logger ?? createLogger("controller");
    this.events = options.eventLog ?? new EventLog({ dir: null, ...(options.clock ? { clock: options.clock } : {}) });
    this.context = new ControllerContext({
      journal: options.journal,
      state: options.state,
      clock: options.clock ?? Date.now,
      log: this.log,
      compactAfterRecords: options.compactAfterRecords ?? DEFAULT_COMPACT_AFTER_RECORDS,
      compactAfterBytes: options.compactAfterBytes ?? DEFAULT_COMPACT_AFTER_BYTES,
      wake: () => this.onWork(),
      applied: (before, record) => this.sessions.trackOwners(before, record),
      observer: observeAll(options.observer ? [this.events, options.observer] : [this.events], this.log),
    });
    this.daemons = new DaemonLiveness(this.context, options.heartbeatTimeoutMs ?? DEFAULT_HEARTBEAT_TIMEOUT_MS, options.daemonRegistered ?? (() => {}));
    this.sessions = new WorkerSessions(
      this.context,
      this.daemons.addressOf,
      () => this.plan,
      {
        heartbeatTimeoutMs: options.workerHeartbeatTimeoutMs ?? DEFAULT_WORKER_HEARTBEAT_TIMEOUT_MS,
        lostJobGraceMs: options.lostJobGraceMs ?? DEFAULT_LOST_JOB_GRACE_MS,
      },
      () => this.watch,
      options.requireVouch ? this.vouches : null,
    );
    this.watch = options.scheduler
      ? new SchedulerWatch(
          this.context,
          options.scheduler,
          options.schedulerPollMs ?? DEFAULT_SCHEDULER_POLL_MS,
          (first) => {
            this.plan.schedulerChanged(first);
            this.context.wake();
          },
          (job) => this.sessions.end(job, `the scheduler reports job ${job} ended`),
        )
      : null;
    this.plan = new PlanExecution(this.context, this.sessions, this.daemons, {
      planner: options.planner ?? new PlanThread(),
      transport: options.transport,
      launcher: options.launcher,
      ...(options.jobUser ? { jobUser: options.jobUser } : {}),
      scheduler: options.scheduler ?? null,
      watch: this.watch,
      unavailable: options.unavailable ?? [],
      timeouts: options.timeouts ?? DEFAULT_TIMEOUTS,
      planTimeLimitMs: options.planTimeLimitMs ?? DEFAULT_PLAN_TIME_LIMIT_MS,
      stopLeadSteps: options.stopLeadSteps ?? DEFAULT_STOP_LEAD_STEPS,
      replanBackoffMs: options.replanBackoffMs ?? DEFAULT_REPLAN_BACKOFF_MS,
    });
    this.plan.recover();
  }

  /** Stops planning; the server calls it as it closes. */
  close(): Promise<void> {
    return this.plan.close();
  }

  get durable(): DurableState {
    return this.context.state;
  }

  /** The durable state and who is connected now, as `status` reports them. */
  /** The workers job `job` has, started or registering: a job's key may send as much as its launchers need. */
  workersOf(job: string): number {
    return this.sessions.workersOf(job);
  }

  view(): LiveView {
    return {
      state: this.context.state,
      ...this.sessions.view(),
      daemons: this.daemons.view(),
      scheduler: this.watch?.view ?? null,
      journalRecords: this.context.journalRecords,
    };
  }

  /**
   * Handles one decoded request from `caller` (the principal its auth frame proved, or `ANYONE`
   * without a keyring); refusals become error replies, never exceptions. Returns whether it was accepted.
   */
  handle(peer: Uint8Array, request: Request, caller: Caller): boolean {
    const target = { peer, id: request.id };
    let accepted = false;
    try {
      const refusal = authorize(caller, request);
      if (refusal) throw new ProtocolError("forbidden", `${refusal.rule}: ${refusal.message}`);
      this.dispatch(target, request);
      accepted = true;
    } catch (error) {
      if (error instanceof ProtocolError) {
        this.log.warn(() => `refused ${request.type} #${request.id}: ${error.message}${error.detail === null ? "" : ` (${error.detail})`}`);
        this.context.send(target, errorReply(request.id, error.code, error.message));
      } else {
        this.log.error(() => `internal error on ${request.type} #${request.id}: ${(error as Error).stack ?? String(error)}`);
        this.context.send(target, errorReply(request.id, "internal", `the controller failed on this ${request.type}: ${(error as Error).message}`));
      }
    }
    this.context.safely("driving the plan", this.drive);
    return accepted;
  }

  /**
   * Deadlines and heartbeats; the server calls it on a timer. `deafMs`: how long before this
   * tick the controller could not read messages, which counts as no daemon's silence.
   */
  tick(deafMs = 0): void {
    this.context.safely("checking deadlines", () => {
      const now = this.context.clock();
      this.daemons.checkHeartbeats(now, deafMs, (host) => this.plan.hostLost(host));
      this.sessions.checkWorkers(now, deafMs);
      this.watch?.tick(now);
      this.plan.checkDeadlines(now);
    });
  }

  /**
   * Plans if an event asked for it, makes the journal durable, then returns the replies to
   * send and starts the effects those records allow.
   */
  drain(): Outgoing[] {
    this.context.safely("planning", this.replanIfWanted);
    return this.context.drain();
  }

  /** Every request reaches its part from here, and only from here. */
  private dispatch(target: ReplyTarget, request: Request): void {
    switch (request.type) {
      case "worker.register":
        return this.sessions.register(target, request);
      case "worker.report":
        return this.sessions.report(target, request);
      case "job.finish":
        return this.sessions.finish(target, request.job);
      case "daemon.register":
        return this.daemons.register(target, request);
      case "daemon.heartbeat":
        return this.daemons.heartbeat(target, request);
      case "daemon.transfer-result":
        return this.plan.transferResult(target, request);
      case "daemon.replacement-exited":
        return this.plan.replacementExited(target, request);
      case "daemon.vouch":
        this.daemons.sender(request, "it cannot vouch for launchers on that host");
        this.vouches.add(request.job, request.host, this.context.clock());
        return this.context.ack(target);
      case "status":
        return this.context.send(target, statusReport(request.id, this.view()));
      case "events":
        return this.context.send(target, this.events.batch(request.id, request.after));
      default:
        return assertNever(request);
    }
  }
}
