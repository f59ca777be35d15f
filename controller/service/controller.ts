import { withinBounds } from "../model/fragmentation.ts";
import { clusterFromSnapshot, rackOf } from "../model/cluster.ts";
import { ringOrder } from "../route/ring-order.ts";
import type { Planner } from "../plan/planner.ts";
import { PROTOCOL_VERSION } from "../../sdk/protocol/envelope.ts";
import { errorReply, ProtocolError } from "../../sdk/protocol/errors.ts";
import type { Reply, Request } from "../../sdk/protocol/codec.ts";
import type { Directive, Register, Barrier, Parallelism } from "../../sdk/protocol/worker.ts";
import type { Heartbeat, HostRegister, TransferResult } from "../../sdk/protocol/daemon.ts";
import { parseTransferEndpoint } from "../../sdk/protocol/endpoint.ts";
import { assignmentOf, jobHosts } from "./assignment.ts";
import type { Journal } from "./journal.ts";
import { createLogger, type Logger } from "../../sdk/log.ts";
import {
  assertNever,
  DEFAULT_TIMEOUTS,
  isCommitted,
  isFinished,
  transition,
  type Migration,
  type MigrationAction,
  type MigrationEvent,
  type MigrationTimeouts,
} from "./migration.ts";
import { recoverMigrations } from "./recovery.ts";
import { statusReport } from "./status.ts";
import { applyRecord, clusterOf, type DurableState, type JournalRecord, type RecordBody } from "./state.ts";
import { decideStep } from "./steps.ts";
import type { ReplacementLauncher, StagingTransport } from "./transport.ts";

/** Who to answer: the ROUTER peer a request came from and the request's id. */
export interface ReplyTarget {
  readonly peer: Uint8Array;
  readonly id: number;
}

export interface Outgoing {
  readonly peer: Uint8Array;
  readonly reply: Reply;
}

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
  readonly planner: Planner;
  readonly transport: StagingTransport;
  readonly launcher: ReplacementLauncher;
  readonly clock?: () => number;
  readonly logger?: Logger;
  readonly timeouts?: MigrationTimeouts;
  readonly planTimeLimitMs?: number;
  /** A daemon silent for this long is declared lost. */
  readonly heartbeatTimeoutMs?: number;
  /**
   * After a plan rolls back, or after a restart, plan again this much later: soon enough to
   * end congestion, late enough that a cause that persists (a dead host) does not pause
   * jobs over and over.
   */
  readonly replanBackoffMs?: number;
}

export const DEFAULT_HEARTBEAT_TIMEOUT_MS = 10_000;
export const DEFAULT_REPLAN_BACKOFF_MS = 30_000;
/** Steps a job trains between the start of its move and its stop barrier. */
export const DEFAULT_STOP_LEAD_STEPS = 0;
/** The journal is rewritten as one snapshot once it holds this many records. */
export const DEFAULT_COMPACT_AFTER_RECORDS = 50_000;
/** Or once this many bytes of records follow the last snapshot, however few records that is. */
export const DEFAULT_COMPACT_AFTER_BYTES = 32 * 2 ** 20;

interface WorkerSession {
  readonly job: string;
  readonly host: number;
  lastStep: number | null;
  /** Generation of the last assignment sent to the worker. */
  sentGeneration: number;
  /** A barrier waiting for the job's directive. */
  held: { readonly step: number; readonly target: ReplyTarget } | null;
  /** A replacement's registration waiting for its job to re-form. */
  heldRegister: ReplyTarget | null;
  /** A directive for this worker's next barrier (its `migrate-out`). */
  pending: Directive | null;
}

interface PendingJob {
  readonly parallelism: Parallelism;
  readonly rings: number;
  launch: readonly string[] | null;
  readonly workers: Map<number, { group: number; bytes: number; target: ReplyTarget }>;
}

interface DaemonSession {
  lastSeen: number;
  lost: boolean;
  /** The host's network address, from the transfer endpoint its daemon advertises. */
  address: string | null;
  /** Size of the host's pre-allocated staging buffer: the largest checkpoint it can take. */
  readonly stagingBytes: number;
}

/**
 * The controller's logic, free of sockets: requests come in through `handle`, and `drain`
 * makes the journal durable and then hands back the replies to send. Effects on other hosts
 * (staging, spawning) run only after the journal records that led to them are on disk.
 */
export class Controller {
  private state: DurableState;
  private readonly clock: () => number;
  private readonly log: Logger;
  private readonly timeouts: MigrationTimeouts;
  private readonly pendingJobs = new Map<string, PendingJob>();
  private readonly workers = new Map<number, WorkerSession>();
  private readonly daemons = new Map<number, DaemonSession>();
  private readonly addressOf = (host: number): string | null => this.daemons.get(host)?.address ?? null;
  /** Replacements that registered before their move committed, by token. */
  private readonly early = new Map<string, { readonly target: ReplyTarget; readonly req: Register }>();
  /** Jobs held at a barrier step for a migration. */
  private readonly stops = new Map<string, number>();
  /** Which job each host runs, started or still registering. */
  private owners = new Map<number, string>();
  private outbox: Outgoing[] = [];
  private effects: (() => void)[] = [];
  private replanWanted = false;
  /** When to plan again after a rollback or restart; null when nothing is scheduled. */
  private replanAt: number | null = null;
  /** Set when a plan's moves are all finished, so it is not driven again. */
  private settledPlan: string | null = null;
  /** Called whenever there is something to drain: the server schedules a drain. */
  onWork: () => void = () => {};

  constructor(private readonly options: ControllerOptions) {
    this.state = options.state;
    this.clock = options.clock ?? Date.now;
    this.log = options.logger ?? createLogger("controller");
    this.timeouts = options.timeouts ?? DEFAULT_TIMEOUTS;
    this.rebuildOwners();
    this.recover();
    if (this.state.jobs.size) this.replanLater();
  }

  get durable(): DurableState {
    return this.state;
  }

  /** Handles one decoded request; refusals become error replies, never exceptions. */
  handle(peer: Uint8Array, request: Request): void {
    const target = { peer, id: request.id };
    try {
      this.dispatch(target, request);
    } catch (error) {
      if (error instanceof ProtocolError) {
        this.log.warn(() => `refused ${request.type} #${request.id}: ${error.message}`);
        this.send(target, errorReply(request.id, error.code, error.message));
      } else {
        this.log.error(() => `internal error on ${request.type} #${request.id}: ${(error as Error).stack ?? String(error)}`);
        this.send(target, errorReply(request.id, "internal", `the controller failed on this ${request.type}: ${(error as Error).message}`));
      }
    }
    this.safely("driving the plan", () => this.drive());
  }

  /** Deadlines and heartbeats; the server calls it on a timer. */
  tick(): void {
    this.safely("checking deadlines", () => this.checkDeadlines());
  }

  private checkDeadlines(): void {
    const now = this.clock();
    for (const [host, daemon] of this.daemons) {
      if (daemon.lost || now - daemon.lastSeen < (this.options.heartbeatTimeoutMs ?? DEFAULT_HEARTBEAT_TIMEOUT_MS)) continue;
      daemon.lost = true;
      this.log.warn(() => `daemon on host ${host} lost: no heartbeat for ${now - daemon.lastSeen} ms`);
      for (const m of this.openMigrations()) {
        if (m.from === host || m.to === host) this.fire(m.id, { type: "fail", reason: `the daemon on host ${host} was lost` });
      }
    }
    for (const m of this.openMigrations()) this.fire(m.id, { type: "tick" });
    if (this.replanAt !== null && now >= this.replanAt) {
      this.replanAt = null;
      this.replanWanted = true;
      this.onWork();
    }
    this.drive();
  }

  /**
   * Plans if an event asked for it, makes the journal durable, then returns the replies to
   * send and starts the effects those records allow.
   */
  drain(): Outgoing[] {
    if (this.replanWanted) this.safely("planning", () => this.replan());
    this.options.journal.flush();
    // Compaction happens here, between bursts, so no record is ever half in an old journal.
    if (
      this.options.journal.records >= (this.options.compactAfterRecords ?? DEFAULT_COMPACT_AFTER_RECORDS) ||
      this.options.journal.bytesSinceCompaction >= (this.options.compactAfterBytes ?? DEFAULT_COMPACT_AFTER_BYTES)
    ) {
      this.options.journal.compact(this.state);
      this.log.info(() => `journal ${this.options.journal.path}: compacted to a snapshot of ${this.state.jobs.size} jobs`);
    }
    const out = this.outbox;
    const effects = this.effects;
    this.outbox = [];
    this.effects = [];
    for (const effect of effects) effect();
    return out;
  }

  private dispatch(target: ReplyTarget, request: Request): void {
    switch (request.type) {
      case "worker.register":
        return this.onRegister(target, request);
      case "worker.barrier":
        return this.onBarrier(target, request);
      case "job.finish":
        return this.onFinish(target, request.job);
      case "daemon.register":
        return this.onHostRegister(target, request);
      case "daemon.heartbeat":
        return this.onHeartbeat(target, request);
      case "daemon.transfer-result":
        return this.onTransferResult(target, request);
      case "status":
        return this.send(
          target,
          statusReport(request.id, {
            state: this.state,
            registering: [...this.pendingJobs].map(([id, p]) => ({ id, hosts: [...p.workers.keys()], expected: p.parallelism.pp * p.parallelism.dp })),
            workers: this.workers.size,
            daemons: [...this.daemons].map(([host, d]) => ({ host, lost: d.lost })),
            journalRecords: this.options.journal.records,
          }),
        );
      default:
        return assertNever(request);
    }
  }

  // ── workers ────────────────────────────────────────────────────────────────────────────

  private onRegister(target: ReplyTarget, req: Register): void {
    const { job: jobId, group, host } = req.worker;
    const { pp, dp } = req.parallelism;
    const hostCount = this.state.topology.racks * this.state.topology.hostsPerRack;
    if (host >= hostCount) throw new ProtocolError("malformed", `worker.host ${host} is out of range: the cluster has hosts 0..${hostCount - 1}`);
    if (group >= pp) throw new ProtocolError("malformed", `worker.group ${group} is out of range: parallelism.pp is ${pp}, so groups are 0..${pp - 1}`);
    if (req.token !== undefined) return this.onReplacement(target, req, req.token);

    const started = this.state.jobs.get(jobId);
    if (started) {
      const assignment = assignmentOf(started, host, this.addressOf);
      if (!assignment || assignment.group !== group) {
        throw new ProtocolError("conflict", `job "${jobId}" runs group ${group} on hosts ${started.groups[group]?.join(", ") ?? "none"}, not on host ${host}; a running job takes new workers only through migrations`);
      }
      const session = this.session(jobId, host);
      session.sentGeneration = started.generation;
      this.send(target, { v: PROTOCOL_VERSION, type: "worker.registered", id: target.id, assignment });
      return;
    }

    const owner = this.owners.get(host);
    if (owner !== undefined && owner !== jobId) throw new ProtocolError("conflict", `host ${host} already runs a worker of job "${owner}"; one worker per host`);
    const incoming = this.openMigrations().find((m) => m.to === host);
    if (incoming) throw new ProtocolError("conflict", `host ${host} is reserved for migration ${incoming.id} of job "${incoming.job}"; place the job elsewhere`);
    const rings = req.rings ?? req.parallelism.tp;
    let pending = this.pendingJobs.get(jobId);
    if (!pending) {
      pending = { parallelism: req.parallelism, rings, launch: null, workers: new Map() };
      this.pendingJobs.set(jobId, pending);
    }
    const p = pending.parallelism;
    if (p.tp !== req.parallelism.tp || p.pp !== pp || p.dp !== dp || pending.rings !== rings) {
      throw new ProtocolError(
        "conflict",
        `job "${jobId}" registered with parallelism tp ${p.tp} pp ${p.pp} dp ${p.dp} rings ${pending.rings}; ` +
          `this worker says tp ${req.parallelism.tp} pp ${pp} dp ${dp} rings ${rings}; every worker of a job must agree`,
      );
    }
    const existing = pending.workers.get(host);
    if (!existing) {
      const inGroup = [...pending.workers.values()].filter((w) => w.group === group).length;
      if (inGroup >= dp) throw new ProtocolError("conflict", `job "${jobId}" group ${group} already has its ${dp} workers (parallelism.dp); host ${host} is one too many`);
    } else if (existing.group !== group) {
      throw new ProtocolError("conflict", `host ${host} registered for job "${jobId}" group ${existing.group}, not ${group}`);
    }
    pending.workers.set(host, { group, bytes: req.checkpointBytes, target });
    pending.launch ??= req.launch ?? null;
    this.owners.set(host, jobId);
    if (pending.workers.size === pp * dp) this.startJob(jobId, pending);
  }

  private startJob(jobId: string, pending: PendingJob): void {
    this.pendingJobs.delete(jobId);
    const cluster = clusterFromSnapshot({ topology: this.state.topology, lambda: this.state.lambda, jobs: [] });
    const groups = Array.from({ length: pending.parallelism.pp }, (_, g) =>
      ringOrder(
        cluster,
        [...pending.workers].filter(([, w]) => w.group === g).map(([host]) => host),
      ),
    );
    const checkpointBytes: Record<string, number> = {};
    for (const [host, w] of pending.workers) checkpointBytes[String(host)] = w.bytes;
    this.record({ kind: "job-started", job: jobId, rings: pending.rings, parallelism: pending.parallelism, groups, checkpointBytes, launch: pending.launch ? [...pending.launch] : null });
    const job = this.state.jobs.get(jobId);
    if (!job) return;
    this.log.info(() => `job ${jobId} started on hosts ${jobHosts(job).join(", ")}`);
    for (const [host, w] of pending.workers) {
      const assignment = assignmentOf(job, host, this.addressOf);
      if (!assignment) continue;
      this.session(jobId, host).sentGeneration = job.generation;
      this.send(w.target, { v: PROTOCOL_VERSION, type: "worker.registered", id: w.target.id, assignment });
    }
    // A group inside one rack adds to no rack's fragmentation, so a job made only of such
    // groups cannot break a bound; most jobs start that way, and skip the check.
    if (groups.some((hosts) => new Set(hosts.map((h) => rackOf(cluster, h))).size > 1)) this.replanWanted = true;
  }

  /**
   * A replacement launcher registers on the destination of a move. Started at prepare, it may
   * call before the move commits: it is held until then (`early`), and refused on a rollback.
   */
  private onReplacement(target: ReplyTarget, req: Register, token: string): void {
    const m = this.activeMoves().find((x) => x.token === token);
    if (!m || m.to !== req.worker.host || m.job !== req.worker.job || m.group !== req.worker.group || m.state === "rolled-back") {
      throw new ProtocolError("invalid_token", `token does not admit job "${req.worker.job}" group ${req.worker.group} on host ${req.worker.host}: no migration in progress carries it there`);
    }
    if (!isCommitted(m.state)) {
      if (!this.early.has(token)) this.log.info(() => `migration ${m.id}: the replacement on host ${m.to} is up before the commit; its registration waits for it`);
      this.early.set(token, { target, req });
      return;
    }
    const session = this.session(m.job, m.to);
    session.heldRegister = target;
    if (m.state === "committing") this.fire(m.id, { type: "replacement-registered" });
    else this.reconfigureJob(m.job);
  }

  private onBarrier(target: ReplyTarget, req: Barrier): void {
    const { job: jobId, host } = req.worker;
    const job = this.state.jobs.get(jobId);
    const assignment = job ? assignmentOf(job, host, this.addressOf) : null;
    if (!job || !assignment || assignment.group !== req.worker.group) {
      const replaced = [...this.state.migrations.values()].find((m) => m.job === jobId && m.from === host && isCommitted(m.state));
      if (replaced) return this.directive(target, { kind: "stop", reason: `replaced by migration ${replaced.id} to host ${replaced.to}` });
      // Another of the job's launchers reported its end first; this worker's last barrier was still on its way.
      if (!job && this.state.finished.includes(jobId)) return this.directive(target, { kind: "stop", reason: `job ${jobId} finished` });
      if (!job) {
        throw new ProtocolError("unknown_job", this.pendingJobs.has(jobId)
          ? `job "${jobId}" has not started: barriers begin after every worker registered and got its assignment`
          : `job "${jobId}" is not known to this controller; register its workers first`);
      }
      throw new ProtocolError("unknown_worker", `job "${jobId}" runs no worker of group ${req.worker.group} on host ${host}; register it first`);
    }
    const session = this.session(jobId, host);
    session.lastStep = Math.max(session.lastStep ?? req.step, req.step);
    // A worker that calls in with a generation already has that assignment, for instance one
    // it got from this controller's predecessor.
    session.sentGeneration = Math.max(session.sentGeneration, req.generation);
    const stop = this.stops.get(jobId);
    if (stop !== undefined && req.step >= stop) {
      if (session.pending) {
        const directive = session.pending;
        session.pending = null;
        return this.directive(target, directive);
      }
      session.held = { step: req.step, target };
      return;
    }
    if (req.generation < job.generation) {
      session.sentGeneration = job.generation;
      this.directive(target, { kind: "reconfigure", assignment });
      this.checkResumed(jobId);
      return;
    }
    this.directive(target, { kind: "continue" });
    this.checkResumed(jobId);
  }

  private onFinish(target: ReplyTarget, jobId: string): void {
    const pending = this.pendingJobs.get(jobId);
    const job = this.state.jobs.get(jobId);
    if (!pending && !job) {
      if (!this.state.finished.includes(jobId)) throw new ProtocolError("unknown_job", `job "${jobId}" is not known to this controller`);
      this.send(target, { v: PROTOCOL_VERSION, type: "job.finished", id: target.id, job: jobId });
      return;
    }
    if (pending) {
      this.pendingJobs.delete(jobId);
      for (const [host, w] of pending.workers) {
        this.owners.delete(host);
        this.send(w.target, errorReply(w.target.id, "unknown_job", `job "${jobId}" finished before all its workers registered`));
      }
    }
    if (job) {
      for (const m of this.openMigrations()) if (m.job === jobId) this.fire(m.id, { type: "fail", reason: `job ${jobId} finished` });
      this.record({ kind: "job-finished", job: jobId });
      this.stops.delete(jobId);
      for (const [host, session] of this.workers) {
        if (session.job !== jobId) continue;
        if (session.held) this.directive(session.held.target, { kind: "stop", reason: `job ${jobId} finished` });
        this.workers.delete(host);
      }
      this.log.info(() => `job ${jobId} finished; hosts ${jobHosts(job).join(", ")} are free`);
      this.replanWanted = true;
    }
    this.send(target, { v: PROTOCOL_VERSION, type: "job.finished", id: target.id, job: jobId });
  }

  // ── daemons ────────────────────────────────────────────────────────────────────────────

  private onHostRegister(target: ReplyTarget, req: HostRegister): void {
    this.checkHost(req.host);
    this.daemons.set(req.host, { lastSeen: this.clock(), lost: false, stagingBytes: req.stagingBytes, address: addressIn(req.endpoint) });
    this.log.info(() => `daemon on host ${req.host} registered (${req.stagingBytes} staging bytes at ${req.endpoint})`);
    this.ack(target);
  }

  private onHeartbeat(target: ReplyTarget, req: Heartbeat): void {
    const daemon = this.daemons.get(req.host);
    if (!daemon) throw new ProtocolError("unknown_worker", `host ${req.host} has no registered daemon; send daemon.register first`);
    if (daemon.lost) this.log.info(() => `daemon on host ${req.host} is back`);
    daemon.lastSeen = this.clock();
    daemon.lost = false;
    this.ack(target);
  }

  private onTransferResult(target: ReplyTarget, req: TransferResult): void {
    const m = this.openMigrations().find((x) => x.token === req.token);
    if (!m || m.to !== req.host) throw new ProtocolError("invalid_token", `no migration in flight to host ${req.host} carries this token`);
    if (req.outcome === "failed") {
      this.fire(m.id, { type: "fail", reason: `transfer to host ${req.host} failed: ${req.detail ?? "no detail"}` });
    } else {
      this.fire(m.id, { type: "transferred", bytes: req.bytes });
      this.fire(
        m.id,
        req.outcome === "verified" ? { type: "verified" } : { type: "checksum-mismatch", detail: req.detail ?? `host ${req.host} computed another checksum` },
      );
    }
    this.ack(target);
  }

  private checkHost(host: number): void {
    const hostCount = this.state.topology.racks * this.state.topology.hostsPerRack;
    if (host >= hostCount) throw new ProtocolError("malformed", `host ${host} is out of range: the cluster has hosts 0..${hostCount - 1}`);
  }

  // ── migrations ─────────────────────────────────────────────────────────────────────────

  private replan(): void {
    this.replanWanted = false;
    if (this.activeMoves().length) {
      this.replanWanted = true;
      return;
    }
    const cluster = clusterOf(this.state);
    if (withinBounds(cluster)) return;
    let plan;
    try {
      plan = this.options.planner.plan(cluster, { timeLimitMs: this.options.planTimeLimitMs ?? 2_000 });
    } catch (error) {
      this.log.error(() => `planning failed, trying again later: ${message(error)}`);
      this.replanLater();
      return;
    }
    this.log.info(() => `fragmentation over λ ${cluster.lambda}: plan ${plan.status}, ${plan.moveCount} moves in ${plan.steps} steps (${plan.solveMs.toFixed(0)} ms)`);
    if (plan.moves.length === 0) return;
    const id = `p${this.state.plans}`;
    this.record({ kind: "plan", plan: id, moves: plan.moves.map((m) => ({ ...m })) });
    this.drive();
  }

  /**
   * Advances the active plan as far as the current facts allow. Each round moves some move
   * forward, and moves wait on workers and hosts after a few rounds; the bound only keeps a
   * bug from spinning the event loop.
   */
  private drive(): void {
    for (let round = 0; round < 16; round++) {
      const moves = this.activeMoves();
      if (moves.length === 0) return;
      const decision = decideStep(moves);
      switch (decision.type) {
        case "start":
          for (const id of decision.ids) {
            const m = this.state.migrations.get(id);
            if (m) this.fire(id, { type: "start", stopStep: this.stopStepFor(m.job) });
          }
          continue;
        case "commit":
          for (const id of decision.ids) this.fire(id, { type: "commit" });
          continue;
        case "abort":
          for (const id of decision.ids) this.fire(id, { type: "fail", reason: decision.reason });
          continue;
        case "finished":
          this.settledPlan = this.state.activePlan;
          this.log.info(() => `plan ${this.state.activePlan} ${decision.outcome === "done" ? "done" : "rolled back"}`);
          if (decision.outcome === "done") this.replanWanted = true;
          else this.replanLater();
          return;
        case "wait":
          if (!this.checkPaused(moves)) return;
          continue;
        default:
          return assertNever(decision);
      }
    }
  }

  /** Fires `paused` for moves whose job has every worker held at its stop step. */
  private checkPaused(moves: readonly Migration[]): boolean {
    let fired = false;
    for (const m of moves) {
      if (m.state !== "pausing" || !this.jobHeld(m.job)) continue;
      this.fire(m.id, { type: "paused" });
      fired = true;
    }
    return fired;
  }

  private jobHeld(jobId: string): boolean {
    const job = this.state.jobs.get(jobId);
    const stop = this.stops.get(jobId);
    if (!job || stop === undefined) return false;
    return jobHosts(job).every((h) => {
      const s = this.workers.get(h);
      return s !== undefined && s.held !== null && s.held.step >= stop;
    });
  }

  /** The barrier all the job's workers stop at: the first one none of them has reported yet. */
  private stopStepFor(jobId: string): number {
    const held = this.stops.get(jobId);
    if (held !== undefined) return held;
    let last = -1;
    for (const s of this.workers.values()) if (s.job === jobId && s.lastStep !== null) last = Math.max(last, s.lastStep);
    // The job trains on for the lead's steps after the move starts, while the destination's
    // replacement starts: its start then costs no downtime.
    return last + 1 + (this.options.stopLeadSteps ?? DEFAULT_STOP_LEAD_STEPS);
  }

  private activeMoves(): Migration[] {
    const plan = this.state.activePlan;
    if (plan === null || plan === this.settledPlan) return [];
    return this.state.activeMoves.flatMap((id) => this.state.migrations.get(id) ?? []);
  }

  /** Only the active plan can have moves in flight: a plan ends when all of its moves have. */
  private openMigrations(): Migration[] {
    return this.activeMoves().filter((m) => !isFinished(m.state));
  }

  private fire(id: string, event: MigrationEvent): void {
    const m = this.state.migrations.get(id);
    if (!m) return;
    const step = transition(m, event, this.clock(), this.timeouts);
    if (step.log) {
      const line = step.log;
      if (step.migration.state === "rolled-back" || step.actions.some((a) => a.type === "alert")) this.log.warn(() => line);
      else this.log.info(() => line);
    }
    if (step.migration !== m) this.record({ kind: "migration", migration: step.migration });
    for (const action of step.actions) this.execute(action);
  }

  private execute(action: MigrationAction): void {
    switch (action.type) {
      case "hold-job":
        this.stops.set(action.job, action.step);
        return;
      case "prepare-staging": {
        const m = this.state.migrations.get(action.migration);
        const job = m && this.state.jobs.get(m.job);
        if (!m || !job) return this.later(() => this.fire(action.migration, { type: "fail", reason: "its job ended before staging" }));
        const daemon = this.daemons.get(action.host);
        if (daemon && daemon.stagingBytes < action.bytes) {
          const reason = `host ${action.host} stages at most ${daemon.stagingBytes} bytes; the checkpoint has ${action.bytes}`;
          return this.effect(() => this.later(() => this.fire(action.migration, { type: "fail", reason })));
        }
        return this.effect(() =>
          this.options.transport.prepare({
            migration: action.migration,
            host: action.host,
            bytes: action.bytes,
            replacement: { job: m.job, group: m.group, parallelism: job.parallelism, launch: job.launch },
          }).then(
            (grant) => this.later(() => this.fire(action.migration, { type: "staging-ready", endpoint: grant.endpoint, token: grant.token })),
            (error: unknown) => this.later(() => this.fire(action.migration, { type: "fail", reason: `host ${action.host} could not stage: ${message(error)}` })),
          ),
        );
      }
      case "migrate-out": {
        const directive: Directive = { kind: "migrate-out", migration: action.migration, to: action.to, endpoint: action.endpoint, token: action.token, step: action.step };
        const session = this.workers.get(action.from);
        if (!session) return;
        if (session.held) {
          const { target } = session.held;
          session.held = null;
          this.directive(target, directive);
        } else {
          session.pending = directive;
        }
        return;
      }
      case "release-staging":
        this.refuseEarly(action.token, "its migration rolled back");
        return this.effect(() =>
          this.options.transport.release(action.host, action.token).catch((error: unknown) => this.log.warn(() => `releasing staging on host ${action.host}: ${message(error)}`)),
        );
      case "stop-source": {
        const session = this.workers.get(action.host);
        if (session?.held) this.directive(session.held.target, { kind: "stop", reason: `replaced by a migration to another host` });
        this.workers.delete(action.host);
        return;
      }
      case "spawn-replacement": {
        const early = this.early.get(action.token);
        if (early) {
          this.early.delete(action.token);
          // After the whole step committed, when the host's previous worker has left it.
          this.later(() => this.admitEarly(action.token, early));
        }
        const job = this.state.jobs.get(action.job);
        if (!job) return this.later(() => this.fire(action.migration, { type: "fail", reason: `job "${action.job}" ended before its replacement started` }));
        return this.effect(() =>
          this.options.launcher
            .spawn({ migration: action.migration, job: action.job, group: action.group, parallelism: job.parallelism, launch: job.launch, host: action.host, token: action.token })
            .catch((error: unknown) => this.later(() => this.fire(action.migration, { type: "fail", reason: `spawning the replacement on host ${action.host}: ${message(error)}` }))),
        );
      }
      case "reconfigure-job":
        return this.reconfigureJob(action.job);
      case "resume-job":
        return this.resumeJob(action.job);
      case "alert":
        this.log.error(() => `migration ${action.migration}: ${action.message}`);
        return;
      default:
        return assertNever(action);
    }
  }

  /**
   * Re-forms the job once every replacement of its committed moves has registered: held
   * workers get `reconfigure`, replacements their assignment, all with the new generation.
   */
  private reconfigureJob(jobId: string): void {
    const job = this.state.jobs.get(jobId);
    if (!job) return;
    if (this.activeMoves().some((m) => m.job === jobId && m.state === "committing")) return;
    this.stops.delete(jobId);
    for (const host of jobHosts(job)) {
      const session = this.workers.get(host);
      const assignment = assignmentOf(job, host, this.addressOf);
      if (!session || !assignment) continue;
      session.pending = null;
      if (session.heldRegister) {
        const target = session.heldRegister;
        session.heldRegister = null;
        session.sentGeneration = job.generation;
        this.send(target, { v: PROTOCOL_VERSION, type: "worker.registered", id: target.id, assignment });
      }
      if (session.held) {
        const { target } = session.held;
        session.held = null;
        session.sentGeneration = job.generation;
        this.directive(target, { kind: "reconfigure", assignment });
      }
    }
    this.checkResumed(jobId);
  }

  /** Fires `resumed` once every worker of the job has its current assignment. */
  private checkResumed(jobId: string): void {
    const job = this.state.jobs.get(jobId);
    if (!job) return;
    const resuming = this.activeMoves().filter((m) => m.job === jobId && m.state === "resuming");
    if (resuming.length === 0) return;
    const current = jobHosts(job).every((h) => this.workers.get(h)?.sentGeneration === job.generation);
    if (!current) return;
    for (const m of resuming) this.fire(m.id, { type: "resumed" });
  }

  private resumeJob(jobId: string): void {
    this.stops.delete(jobId);
    for (const session of this.workers.values()) {
      if (session.job !== jobId) continue;
      session.pending = null;
      if (session.held) {
        const { target } = session.held;
        session.held = null;
        this.directive(target, { kind: "continue" });
      }
    }
  }

  private recover(): void {
    const recovery = recoverMigrations(this.state, this.clock());
    for (const line of recovery.log) this.log.warn(() => line);
    for (const m of recovery.migrations) this.record({ kind: "migration", migration: m });
    for (const action of recovery.actions) this.execute(action);
  }

  // ── plumbing ───────────────────────────────────────────────────────────────────────────

  private record(body: RecordBody): void {
    const record = this.options.journal.append(body);
    const before = this.state;
    this.state = applyRecord(before, record);
    this.trackOwners(before, record);
    this.onWork();
  }

  /** Keeps `owners` in step with a record, touching only the hosts it changes. */
  private trackOwners(before: DurableState, record: JournalRecord): void {
    switch (record.kind) {
      case "job-started":
        for (const hosts of record.groups) for (const h of hosts) this.owners.set(h, record.job);
        return;
      case "job-finished":
        for (const h of jobHosts(before.jobs.get(record.job) ?? { groups: [] })) this.owners.delete(h);
        return;
      case "migration": {
        const m = record.migration;
        const was = before.migrations.get(m.id);
        if (was && !isCommitted(was.state) && isCommitted(m.state)) {
          // In a swap another move of the step may already have landed on this source.
          if (this.owners.get(m.from) === m.job) this.owners.delete(m.from);
          this.owners.set(m.to, m.job);
        }
        return;
      }
      case "config":
      case "plan":
      case "snapshot":
        return;
      default:
        return assertNever(record);
    }
  }

  private replanLater(): void {
    this.replanAt = this.clock() + (this.options.replanBackoffMs ?? DEFAULT_REPLAN_BACKOFF_MS);
  }

  private rebuildOwners(): void {
    this.owners = new Map();
    for (const job of this.state.jobs.values()) for (const h of jobHosts(job)) this.owners.set(h, job.id);
  }

  private session(job: string, host: number): WorkerSession {
    let session = this.workers.get(host);
    if (!session || session.job !== job) {
      session = { job, host, lastStep: null, sentGeneration: -1, held: null, heldRegister: null, pending: null };
      this.workers.set(host, session);
    }
    return session;
  }

  private directive(target: ReplyTarget, directive: Directive): void {
    this.send(target, { v: PROTOCOL_VERSION, type: "worker.directive", id: target.id, directive });
  }

  private ack(target: ReplyTarget): void {
    this.send(target, { v: PROTOCOL_VERSION, type: "ack", id: target.id });
  }

  private send(target: ReplyTarget, reply: Reply): void {
    this.outbox.push({ peer: target.peer, reply });
    this.onWork();
  }

  private effect(run: () => void): void {
    this.effects.push(run);
    this.onWork();
  }

  /** Work that arrives outside a request (a transport's answer): handle it, then drive. */
  private later(run: () => void): void {
    this.safely("handling a host's answer", () => {
      run();
      this.drive();
    });
  }

  /** A replacement that registered before its move committed is now admitted (or told why not). */
  private admitEarly(token: string, early: { readonly target: ReplyTarget; readonly req: Register }): void {
    try {
      this.onReplacement(early.target, early.req, token);
    } catch (error) {
      if (!(error instanceof ProtocolError)) throw error;
      this.send(early.target, errorReply(early.target.id, error.code, error.message));
    }
  }

  /** Answers a held early registration with a refusal: its move will not commit. */
  private refuseEarly(token: string, why: string): void {
    const early = this.early.get(token);
    if (!early) return;
    this.early.delete(token);
    this.send(early.target, errorReply(early.target.id, "invalid_token", `the replacement is not needed: ${why}`));
  }

  /** A bug in one decision is logged; it must not take the controller down with it. */
  private safely(what: string, run: () => void): void {
    try {
      run();
    } catch (error) {
      this.log.error(() => `internal error while ${what}: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}`);
    }
  }
}

const addressIn = (endpoint: string): string | null => parseTransferEndpoint(endpoint)?.host ?? null;

const message = (error: unknown): string => (error instanceof Error ? error.message : String(error));
