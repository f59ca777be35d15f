import { clusterFromSnapshot, rackOf } from "../planner/model/cluster.ts";
import { ringOrder } from "../planner/route/ring-order.ts";
import { PROTOCOL_VERSION } from "../../sdk/contract/protocol/envelope.ts";
import { errorReply, ProtocolError } from "../../sdk/contract/protocol/errors.ts";
import type { Hold, Order, Parallelism, Register, Report } from "../../sdk/contract/protocol/worker.ts";
import { assignmentOf, jobHosts } from "./assignment.ts";
import type { ControllerContext, ReplyTarget } from "./context.ts";
import { assertNever, isCommitted, isReversible, type Migration, type MigrationEvent } from "./migration.ts";
import type { DurableState, JobState, JournalRecord } from "./state.ts";
import type { JobProgress } from "./status.ts";
import type { Vouches } from "./vouches.ts";

/**
 * Worker sessions: workers registering until their job starts, replacements registering on
 * a move's destination (held while the move has not committed), the stops a job makes for a
 * move, and jobs finishing. Holds who is connected and which host each job owns; none of it is
 * durable, workers bring it back by reporting again.
 *
 * A launcher reports (`worker.report`) on a timer of its own: its step, step time and hold.
 * Each report is answered with the worker's current order, and every change of that order is
 * pushed to the peer of its latest report, so no training step waits for the controller. A
 * stop is agreed as sdk/contract/protocol/README.md argues: the job stops at the largest step any of its
 * hosts says it will hold at, and a move goes on only once every host holds there.
 *
 * A worker that reported and then fell silent for the worker heartbeat timeout is lost; once
 * every worker of a started job is lost, its launchers are gone, and after the lost-job grace
 * the job is ended as if they had reported its end.
 */

/** A worker that heartbeats and is silent for this long is lost. */
export const DEFAULT_WORKER_HEARTBEAT_TIMEOUT_MS = 10_000;
/** A job whose every worker is lost ends this much later, unless one of them is heard again. */
export const DEFAULT_LOST_JOB_GRACE_MS = 60_000;

export interface WorkerLivenessOptions {
  readonly heartbeatTimeoutMs: number;
  readonly lostJobGraceMs: number;
}

/** What worker sessions ask of plan execution. */
export interface SessionMoves {
  /** The active plan's moves, finished ones included. */
  activeMoves(): Migration[];
  /** The active plan's moves still in flight. */
  openMigrations(): Migration[];
  fire(id: string, event: MigrationEvent): void;
  /** Re-forms the job once every replacement of its committed moves has registered. */
  reconfigureJob(job: string): void;
  /** The job's hosts agreed on a later stop step than the one its moves started with. */
  raised(job: string, step: number): void;
  /** Fires `resumed` once every worker of the job has its current assignment. */
  checkResumed(job: string): void;
  /** Plans again at the next drain. */
  replanSoon(): void;
}

interface WorkerSession {
  readonly job: string;
  readonly host: number;
  /** Where its orders are pushed: the peer of its latest report; null before the first. */
  peer: Uint8Array | null;
  /** The last barrier it reported, its step time, and when (the controller's clock). */
  step: number | null;
  stepMs: number | null;
  reportedAt: number;
  /** Whether that report's step was past the one before: a worker that is not training is not projected forward. */
  advancing: boolean;
  /** Generation of the assignment it runs with, as it reported or was registered with. */
  generation: number;
  /** Its hold as it last reported it. */
  hold: Hold | null;
  /** A replacement's registration waiting for its job to re-form. */
  heldRegister: ReplyTarget | null;
  /** Its `migrate-out`, while it is a move's source. */
  migrateOut: Extract<Order, { kind: "migrate-out" }> | null;
  /** When the controller last heard from the worker's launcher, by any request. */
  heardAt: number;
  /** Whether its launcher reports, so that its silence means it is gone. */
  heartbeats: boolean;
  /** Silent past the heartbeat timeout. */
  lost: boolean;
}

/** A stop a job makes for its moves of one plan step. */
interface JobStop {
  readonly id: string;
  /** The barrier every host holds at; raised when a host had passed it. */
  step: number;
  /** Every host was asked to seal: the step's moves commit once all have. */
  sealing: boolean;
}

interface PendingJob {
  readonly parallelism: Parallelism;
  readonly rings: number;
  replacement: string | null;
  /** `heardAt`: its launcher's latest (re)send; it sends again until answered. */
  readonly workers: Map<number, { group: number; bytes: number; target: ReplyTarget; heardAt: number }>;
}

/**
 * What the scheduler that owns the hosts (Slurm) says of its jobs' allocations: a worker
 * registers only on a host of its job's allocation.
 */
export interface Allocations {
  /** The hosts of the job's allocation at the latest look; undefined when that look did not see the job. */
  of(job: string): ReadonlySet<number> | undefined;
  /** Calls `then` once a look that started after this call arrived. */
  lookAgain(then: () => void): void;
}

interface WaitingRegistration {
  readonly target: ReplyTarget;
  readonly req: Register;
}

/** A replacement that registered before its move committed. */
export interface EarlyRegistration {
  readonly target: ReplyTarget;
  readonly req: Register;
}

export class WorkerSessions {
  private readonly pendingJobs = new Map<string, PendingJob>();
  private readonly workers = new Map<number, WorkerSession>();
  /** Replacements that registered before their move committed, by token. */
  private readonly early = new Map<string, EarlyRegistration>();
  /** Jobs stopping, or stopped, for a migration. */
  private readonly stops = new Map<string, JobStop>();
  /** Which job each host runs, started or still registering. */
  private readonly owners = new Map<number, string>();
  /** Registrations of jobs the scheduler's latest look did not see, by job and host, until the next look. */
  private readonly unseen = new Map<string, Map<number, WaitingRegistration>>();
  /**
   * Jobs the journal restored that no worker has spoken for since, with when that silence
   * began: a job that finished while the controller was down has no launcher left to say so,
   * and no session that could be declared lost.
   */
  private readonly unheard = new Map<string, number>();

  constructor(
    private readonly context: ControllerContext,
    private readonly addressOf: (host: number) => string | null,
    /** Plan execution; a function, since it is built after the sessions it acts on. */
    private readonly moves: () => SessionMoves,
    private readonly liveness: WorkerLivenessOptions,
    /** The scheduler's allocations, when one owns the hosts. */
    private readonly allocations: () => Allocations | null = () => null,
    /** Daemons' vouches for their hosts' launchers, when a new worker needs one (`--require-vouch`). */
    private readonly vouches: Vouches | null = null,
  ) {
    for (const job of context.state.jobs.values()) {
      for (const h of jobHosts(job)) this.owners.set(h, job.id);
      this.unheard.set(job.id, context.clock());
    }
  }

  private get state(): DurableState {
    return this.context.state;
  }

  // ── requests ───────────────────────────────────────────────────────────────────────────

  register(target: ReplyTarget, req: Register): void {
    const { job: jobId, group, host } = req.worker;
    const { pp, dp } = req.parallelism;
    const hostCount = this.state.topology.racks * this.state.topology.hostsPerRack;
    if (host >= hostCount) throw new ProtocolError("malformed", `worker.host ${host} is out of range: the cluster has hosts 0..${hostCount - 1}`);
    if (group >= pp) throw new ProtocolError("malformed", `worker.group ${group} is out of range: parallelism.pp is ${pp}, so groups are 0..${pp - 1}`);
    if (pp * dp > hostCount)
      throw new ProtocolError(
        "malformed",
        `parallelism.pp × parallelism.dp is ${pp * dp}, more than the cluster's ${hostCount} hosts; a job runs one worker per host`,
      );
    if (req.token !== undefined) return this.registerReplacement(target, req, req.token);

    const started = this.state.jobs.get(jobId);
    if (started) {
      const assignment = assignmentOf(started, host, this.addressOf);
      if (!assignment || assignment.group !== group) {
        throw new ProtocolError(
          "conflict",
          `job "${jobId}" runs group ${group} on hosts ${started.groups[group]?.join(", ") ?? "none"}, not on host ${host}; a running job takes new workers only through migrations`,
        );
      }
      this.session(jobId, host).generation = started.generation;
      this.context.send(target, { v: PROTOCOL_VERSION, type: "worker.registered", id: target.id, assignment });
      return;
    }
    this.requireVouch(req);
    if (this.admitted(target, req)) this.registerPending(target, req);
  }

  /** With `--require-vouch`, a new worker's host must have vouched for a launcher of its job; its resends need not again. */
  private requireVouch(req: Register): void {
    const { job, host } = req.worker;
    if (!this.vouches || this.pendingJobs.get(job)?.workers.has(host) || this.vouches.holds(job, host, this.context.clock())) return;
    throw new ProtocolError(
      "forbidden",
      `host ${host}'s daemon has not vouched for a launcher of job "${job}"; this controller takes a worker only from a launcher on its host: start \`monkeytree launch\` there, where the host's daemon listens on its local socket (--daemon-socket)`,
    );
  }

  /**
   * A worker of a job that has not started. Refusals never name another job, its hosts or its
   * moves (the log has them): a tenant learns only that the host it asked for is taken.
   */
  private registerPending(target: ReplyTarget, req: Register): void {
    const { job: jobId, group, host } = req.worker;
    const { pp, dp } = req.parallelism;
    const owner = this.owners.get(host);
    if (owner !== undefined && owner !== jobId)
      throw new ProtocolError("conflict", `host ${host} already runs a worker of another job; one worker per host`, `job "${owner}" has it`);
    const incoming = this.moves()
      .openMigrations()
      .find((m) => m.to === host);
    if (incoming)
      throw new ProtocolError(
        "conflict",
        `host ${host} is the destination of a migration in progress; place the job elsewhere`,
        `migration ${incoming.id} of job "${incoming.job}"`,
      );
    const rings = req.rings ?? req.parallelism.tp;
    let pending = this.pendingJobs.get(jobId);
    if (!pending) {
      pending = { parallelism: req.parallelism, rings, replacement: null, workers: new Map() };
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
      if (inGroup >= dp)
        throw new ProtocolError("conflict", `job "${jobId}" group ${group} already has its ${dp} workers (parallelism.dp); host ${host} is one too many`);
    } else if (existing.group !== group) {
      throw new ProtocolError("conflict", `host ${host} registered for job "${jobId}" group ${existing.group}, not ${group}`);
    }
    pending.workers.set(host, { group, bytes: req.checkpointBytes, target, heardAt: this.context.clock() });
    pending.replacement ??= req.replacement ?? null;
    this.owners.set(host, jobId);
    if (pending.workers.size === pp * dp) this.startJob(jobId, pending);
  }

  /**
   * Under a scheduler, whether the worker may register: only on a host of its job's allocation,
   * and no more workers than that has hosts. A job the latest look did not see waits for a
   * fresh look (it may have started since), and returns false.
   */
  private admitted(target: ReplyTarget, req: Register): boolean {
    const allocations = this.allocations();
    if (!allocations) return true;
    const { job, host } = req.worker;
    const hosts = allocations.of(job);
    if (hosts === undefined) {
      this.awaitLook(allocations, { target, req });
      return false;
    }
    if (!hosts.has(host))
      throw new ProtocolError(
        "conflict",
        `host ${host} is not in job "${job}"'s allocation; its workers register only on the hosts the scheduler allocated to it`,
      );
    const { pp, dp } = req.parallelism;
    if (pp * dp > hosts.size)
      throw new ProtocolError("conflict", `parallelism pp ${pp} × dp ${dp} needs ${pp * dp} hosts, and job "${job}"'s allocation has ${hosts.size}`);
    return true;
  }

  /** Keeps the registration (one per job and host: a resend replaces it) until the next look. */
  private awaitLook(allocations: Allocations, waiting: WaitingRegistration): void {
    const { job, host } = waiting.req.worker;
    const jobs = this.unseen.get(job) ?? new Map<number, WaitingRegistration>();
    jobs.set(host, waiting);
    this.unseen.set(job, jobs);
    allocations.lookAgain(this.retryUnseen);
  }

  /** The look after those registrations arrived: each goes on, or is refused for a job the scheduler does not run. */
  private readonly retryUnseen = (): void => {
    const waiting = [...this.unseen.values()].flatMap((jobs) => [...jobs.values()]);
    this.unseen.clear();
    for (const { target, req } of waiting) {
      this.answerRefusal(target, req, () => {
        if (this.allocations()?.of(req.worker.job) === undefined) {
          throw new ProtocolError(
            "unknown_job",
            `job "${req.worker.job}" is not a job the scheduler runs; under a scheduler a job's id is its scheduler job id, and its workers register once it runs`,
          );
        }
        this.register(target, req);
      });
    }
  };

  /** Runs `run` for a held request, answering a refusal as `Controller.handle` would. */
  private answerRefusal(target: ReplyTarget, req: Register, run: () => void): void {
    try {
      run();
    } catch (error) {
      if (!(error instanceof ProtocolError)) throw error;
      this.context.log.warn(
        () =>
          `refused worker.register of job ${req.worker.job} on host ${req.worker.host}: ${error.message}${error.detail === null ? "" : ` (${error.detail})`}`,
      );
      this.context.send(target, errorReply(target.id, error.code, error.message));
    }
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
    this.context.record({
      kind: "job-started",
      job: jobId,
      rings: pending.rings,
      parallelism: pending.parallelism,
      groups,
      checkpointBytes,
      replacement: pending.replacement,
    });
    const job = this.state.jobs.get(jobId);
    if (!job) return;
    this.context.log.info(() => `job ${jobId} started on hosts ${jobHosts(job).join(", ")}`);
    for (const [host, w] of pending.workers) {
      const assignment = assignmentOf(job, host, this.addressOf);
      if (!assignment) continue;
      this.session(jobId, host).generation = job.generation;
      this.context.send(w.target, { v: PROTOCOL_VERSION, type: "worker.registered", id: w.target.id, assignment });
    }
    // A group inside one rack adds to no rack's fragmentation, so a job made only of such
    // groups cannot break a bound; most jobs start that way, and skip the check.
    if (groups.some((hosts) => new Set(hosts.map((h) => rackOf(cluster, h))).size > 1)) this.moves().replanSoon();
  }

  /**
   * A replacement launcher registers on the destination of a move. Started at prepare, it
   * registers once its processes are ready, before the move commits: that lets the job pause,
   * and the registration is held until the commit (`early`), or refused on a rollback.
   */
  private registerReplacement(target: ReplyTarget, req: Register, token: string): void {
    const m = this.moves()
      .activeMoves()
      .find((x) => x.token === token);
    if (!m || m.to !== req.worker.host || m.job !== req.worker.job || m.group !== req.worker.group || m.state === "rolled-back") {
      throw new ProtocolError(
        "invalid_token",
        `token does not admit job "${req.worker.job}" group ${req.worker.group} on host ${req.worker.host}: no migration in progress carries it there`,
      );
    }
    if (!isCommitted(m.state)) {
      // The launcher asks again until answered; only its first call is news.
      const first = !this.early.has(token);
      this.early.set(token, { target, req });
      if (!first) return;
      this.context.log.info(() => `migration ${m.id}: the replacement on host ${m.to} is ready before the commit; its registration waits for it`);
      this.moves().fire(m.id, { type: "replacement-ready" });
      return;
    }
    const session = this.session(m.job, m.to);
    session.heldRegister = target;
    if (m.state === "committing") this.moves().fire(m.id, { type: "replacement-registered" });
    else this.moves().reconfigureJob(m.job);
  }

  report(target: ReplyTarget, req: Report): void {
    const { job: jobId, group, host } = req.worker;
    const job = this.state.jobs.get(jobId);
    if (!job || job.groups[group]?.includes(host) !== true) return this.reportOfStranger(target, req);
    const session = this.session(jobId, host);
    session.peer = target.peer;
    session.advancing = req.step !== null && session.step !== null && req.step > session.step;
    session.step = req.step;
    session.stepMs = req.stepMs;
    session.reportedAt = this.context.clock();
    session.generation = req.generation;
    session.hold = req.hold;
    session.heartbeats = true;
    this.agree(jobId, session);
    this.answer(target, session);
    this.moves().checkResumed(jobId);
  }

  /**
   * A report from a worker the job does not run (or no longer runs): a source its committed move
   * replaced, the last word of a job that finished, or a mistake.
   */
  private reportOfStranger(target: ReplyTarget, req: Report): void {
    const { job: jobId, group, host } = req.worker;
    const stop = (reason: string) =>
      this.context.send(target, { v: PROTOCOL_VERSION, type: "worker.order", id: target.id, worker: req.worker, order: { kind: "stop", reason } });
    const replaced = [...this.state.migrations.values()].find((m) => m.job === jobId && m.from === host && isCommitted(m.state));
    if (replaced) return stop(`replaced by migration ${replaced.id} to host ${replaced.to}`);
    if (!this.state.jobs.has(jobId) && this.state.finished.includes(jobId)) return stop(`job ${jobId} finished`);
    if (!this.state.jobs.has(jobId)) {
      throw new ProtocolError(
        "unknown_job",
        this.pendingJobs.has(jobId)
          ? `job "${jobId}" has not started: reports begin after every worker registered and got its assignment`
          : `job "${jobId}" is not known to this controller; register its workers first`,
      );
    }
    throw new ProtocolError("unknown_worker", `job "${jobId}" runs no worker of group ${group} on host ${host}; register it first`);
  }

  /**
   * What a report changes in the job's stop: a host that had passed the stop step holds at a
   * later one, which becomes the job's; a host that let go of the stop by itself (its hold
   * timeout passed without word from the controller) trains on, so the stop's moves roll back.
   */
  private agree(jobId: string, session: WorkerSession): void {
    const stop = this.stops.get(jobId);
    const hold = session.hold;
    if (!stop || hold?.stop !== stop.id) return;
    if (hold.phase === "released") {
      this.failJob(jobId, `host ${session.host} let go of stop ${stop.id} after its hold timeout without word from the controller, and trains on`);
    } else if ((hold.phase === "armed" || hold.phase === "held") && hold.step > stop.step && !stop.sealing) {
      this.context.log.info(() => `stop ${stop.id} of job ${jobId}: host ${session.host} had passed barrier ${stop.step}; the job stops at ${hold.step}`);
      stop.step = hold.step;
      this.moves().raised(jobId, hold.step);
      this.pushAll(jobId);
    }
  }

  /** Fails the job's moves that can still roll back. */
  private failJob(jobId: string, why: string): void {
    for (const m of this.moves().openMigrations()) if (m.job === jobId && isReversible(m.state)) this.moves().fire(m.id, { type: "fail", reason: why });
  }

  /** What the worker must do now. */
  private orderOf(session: WorkerSession): Order {
    const job = this.state.jobs.get(session.job);
    if (!job) return { kind: "stop", reason: `job ${session.job} finished` };
    const stop = this.stops.get(session.job);
    if (stop) {
      // Sealing comes after every checkpoint of the step was verified, so after every migrate-out.
      if (stop.sealing) return { kind: "seal", stop: stop.id };
      return session.migrateOut ?? { kind: "stop-at", stop: stop.id, step: stop.step };
    }
    const assignment = session.generation < job.generation ? assignmentOf(job, session.host, this.addressOf) : null;
    return assignment ? { kind: "reconfigure", assignment } : { kind: "run" };
  }

  private answer(target: ReplyTarget, session: WorkerSession, order: Order = this.orderOf(session)): void {
    this.context.send(target, {
      v: PROTOCOL_VERSION,
      type: "worker.order",
      id: target.id,
      worker: { job: session.job, group: this.groupOf(session), host: session.host },
      order,
    });
  }

  /** Pushes the worker's order to its launcher (id 0: it answers no request). */
  private push(session: WorkerSession, order?: Order): void {
    if (session.peer) this.answer({ peer: session.peer, id: 0 }, session, order);
  }

  private pushAll(jobId: string): void {
    for (const session of this.workers.values()) if (session.job === jobId) this.push(session);
  }

  private groupOf(session: WorkerSession): number {
    const job = this.state.jobs.get(session.job);
    return job?.groups.findIndex((hosts) => hosts.includes(session.host)) ?? 0;
  }

  finish(target: ReplyTarget, jobId: string): void {
    if (!this.end(jobId, `job ${jobId} finished`) && !this.state.finished.includes(jobId)) {
      throw new ProtocolError("unknown_job", `job "${jobId}" is not known to this controller`);
    }
    this.context.send(target, { v: PROTOCOL_VERSION, type: "job.finished", id: target.id, job: jobId });
  }

  /**
   * Ends job `jobId` because `why`: its moves in flight fail, it is journaled finished, and its
   * workers are told to stop (a held barrier now, the others at their next one, which finds
   * no job). Returns whether the controller knew the job.
   */
  end(jobId: string, why: string): boolean {
    const pending = this.pendingJobs.get(jobId);
    const job = this.state.jobs.get(jobId);
    if (pending) {
      this.pendingJobs.delete(jobId);
      for (const [host, w] of pending.workers) {
        this.owners.delete(host);
        this.context.send(w.target, errorReply(w.target.id, "unknown_job", `job "${jobId}" finished before all its workers registered`));
      }
    }
    if (job) {
      for (const m of this.moves().openMigrations()) if (m.job === jobId) this.moves().fire(m.id, { type: "fail", reason: why });
      this.context.record({ kind: "job-finished", job: jobId });
      this.stops.delete(jobId);
      for (const [host, session] of this.workers) {
        if (session.job !== jobId) continue;
        this.push(session, { kind: "stop", reason: why });
        this.workers.delete(host);
      }
      this.context.log.info(() => `${why}; hosts ${jobHosts(job).join(", ")} are free`);
      this.moves().replanSoon();
    }
    return pending !== undefined || job !== undefined;
  }

  /**
   * Declares lost every heartbeating worker silent past the timeout, and ends every started
   * job whose workers have all been lost for the grace. The last `deafMs` the controller did
   * not listen: that time counts toward no timeout.
   */
  checkWorkers(now: number, deafMs: number): void {
    const { heartbeatTimeoutMs, lostJobGraceMs } = this.liveness;
    this.expirePending(now, deafMs);
    for (const session of this.workers.values()) {
      session.heardAt += deafMs;
      const lost = session.heartbeats && now - session.heardAt >= heartbeatTimeoutMs;
      if (lost === session.lost) continue;
      session.lost = lost;
      if (!lost) continue;
      const silentMs = Math.round(now - session.heardAt);
      this.context.log.warn(() => `worker of job ${session.job} on host ${session.host} lost: no word from its launcher for ${silentMs} ms`);
      this.context.observer.workerLost(session.job, session.host, silentMs);
      if (this.stops.has(session.job)) this.failJob(session.job, `the worker on host ${session.host} went silent while its job stopped`);
    }
    for (const job of this.state.jobs.values()) {
      const silentMs = this.jobSilence(job, now);
      if (silentMs !== null && silentMs >= heartbeatTimeoutMs + lostJobGraceMs) {
        this.end(job.id, `every worker of job ${job.id} lost, the last heard ${Math.round(silentMs)} ms ago: its launchers are gone`);
      }
    }
    this.endUnheard(now, deafMs, heartbeatTimeoutMs + lostJobGraceMs);
  }

  /** Ends each restored job none of whose workers came back within `afterMs`: it finished, or its launchers died, while the controller was down. */
  private endUnheard(now: number, deafMs: number, afterMs: number): void {
    for (const [jobId, since] of this.unheard) {
      const from = since + deafMs;
      this.unheard.set(jobId, from);
      if (!this.state.jobs.has(jobId)) this.unheard.delete(jobId);
      else if (now - from >= afterMs) {
        this.unheard.delete(jobId);
        this.end(
          jobId,
          `no worker of job ${jobId} was heard in the ${Math.round(now - from)} ms since the controller restarted: it finished or its launchers are gone`,
        );
      }
    }
  }

  /**
   * Frees the hosts of registrations whose launcher stopped sending them for the heartbeat
   * timeout (a launcher sends its registration again until it is answered): a launcher that
   * gave up or died holds no host for a job that will never start.
   */
  private expirePending(now: number, deafMs: number): void {
    for (const [jobId, pending] of this.pendingJobs) {
      for (const [host, w] of pending.workers) {
        w.heardAt += deafMs;
        if (now - w.heardAt < this.liveness.heartbeatTimeoutMs) continue;
        pending.workers.delete(host);
        if (this.owners.get(host) === jobId) this.owners.delete(host);
        this.context.log.info(
          () => `registration of job ${jobId} on host ${host} dropped: its launcher stopped sending it ${Math.round(now - w.heardAt)} ms ago`,
        );
      }
      if (pending.workers.size === 0) this.pendingJobs.delete(jobId);
    }
  }

  /** How long since the job's last worker was heard, once every one of them is lost; null before. */
  private jobSilence(job: JobState, now: number): number | null {
    let heardAt = -Infinity;
    for (const host of jobHosts(job)) {
      const session = this.workers.get(host);
      if (session?.job !== job.id || !session.lost) return null;
      heardAt = Math.max(heardAt, session.heardAt);
    }
    return now - heardAt;
  }

  // ── what plan execution does with the workers ──────────────────────────────────────────

  /**
   * Stops the job at barrier `step` for stop `id` (or at a later step its hosts agree on): every
   * host is told at once, and holds there until told what to do.
   */
  hold(jobId: string, id: string, step: number, sealed = false): void {
    const stop = this.stops.get(jobId);
    if (stop?.id === id) return;
    this.stops.set(jobId, { id, step, sealing: sealed });
    this.pushAll(jobId);
  }

  /** The barrier step the job is stopping at, if it is. */
  heldAt(jobId: string): number | undefined {
    return this.stops.get(jobId)?.step;
  }

  /** Whether every worker of the job holds at its stop step. */
  jobHeld(jobId: string): boolean {
    const stop = this.stops.get(jobId);
    return stop !== undefined && this.everyHost(jobId, (h) => h.stop === stop.id && h.step === stop.step && h.phase !== "armed" && h.phase !== "released");
  }

  /** Asks every worker of the job to seal its hold: from then on only the controller ends it. */
  seal(jobId: string): void {
    const stop = this.stops.get(jobId);
    if (!stop || stop.sealing) return;
    stop.sealing = true;
    this.pushAll(jobId);
  }

  /** Whether every worker of the job sealed its hold, so that the job's moves may commit. */
  sealed(jobId: string): boolean {
    const stop = this.stops.get(jobId);
    return stop !== undefined && stop.sealing && this.everyHost(jobId, (h) => h.stop === stop.id && h.phase === "sealed");
  }

  private everyHost(jobId: string, test: (hold: Hold) => boolean): boolean {
    const job = this.state.jobs.get(jobId);
    if (!job) return false;
    return jobHosts(job).every((h) => {
      const hold = this.workers.get(h)?.hold;
      return hold !== null && hold !== undefined && test(hold);
    });
  }

  /**
   * Where the job's furthest host is now: its last reported step plus, for a host that was
   * training, the steps its step time says it has trained since; -1 before any report.
   */
  projectedStep(jobId: string): number {
    const now = this.context.clock();
    let furthest = -1;
    for (const s of this.workers.values()) {
      if (s.job !== jobId || s.step === null) continue;
      const since = s.advancing && s.stepMs ? Math.floor((now - s.reportedAt) / s.stepMs) : 0;
      furthest = Math.max(furthest, s.step + since);
    }
    return furthest;
  }

  /** The source on `host` checkpoints into the destination's staging. */
  migrateOut(host: number, fields: Omit<Extract<Order, { kind: "migrate-out" }>, "kind" | "stop">): void {
    const session = this.workers.get(host);
    const stop = session && this.stops.get(session.job);
    if (!session || !stop) return;
    session.migrateOut = { kind: "migrate-out", stop: stop.id, ...fields };
    this.push(session);
  }

  /** The worker on `host` was replaced by a committed move: it is told to stop and forgotten. */
  stopSource(host: number): void {
    const session = this.workers.get(host);
    if (session) this.push(session, { kind: "stop", reason: `replaced by a migration to another host` });
    this.workers.delete(host);
  }

  /** Takes the early registration held for `token`, if any. */
  takeEarly(token: string): EarlyRegistration | undefined {
    const early = this.early.get(token);
    this.early.delete(token);
    return early;
  }

  /** A replacement that registered before its move committed is now admitted (or told why not). */
  admitEarly(token: string, early: EarlyRegistration): void {
    try {
      this.registerReplacement(early.target, early.req, token);
    } catch (error) {
      if (!(error instanceof ProtocolError)) throw error;
      this.context.send(early.target, errorReply(early.target.id, error.code, error.message));
    }
  }

  /** Answers a held early registration with a refusal: its move will not commit. */
  refuseEarly(token: string, why: string): void {
    const early = this.takeEarly(token);
    if (!early) return;
    this.context.send(early.target, errorReply(early.target.id, "invalid_token", `the replacement is not needed: ${why}`));
  }

  /** Gives every worker of the job its new assignment: held workers and held replacements. */
  reform(job: JobState): void {
    this.stops.delete(job.id);
    for (const host of jobHosts(job)) {
      const session = this.workers.get(host);
      const assignment = assignmentOf(job, host, this.addressOf);
      if (!session || !assignment) continue;
      session.migrateOut = null;
      if (session.heldRegister) {
        // Its generation comes with its first report: until then the job has not resumed.
        const target = session.heldRegister;
        session.heldRegister = null;
        this.context.send(target, { v: PROTOCOL_VERSION, type: "worker.registered", id: target.id, assignment });
      }
      this.push(session);
    }
  }

  /** Whether every worker of the job runs with its current assignment. */
  current(job: JobState): boolean {
    return jobHosts(job).every((h) => this.workers.get(h)?.generation === job.generation);
  }

  /** Releases the job's held workers where they stopped. */
  resume(jobId: string): void {
    this.stops.delete(jobId);
    for (const session of this.workers.values()) {
      if (session.job !== jobId) continue;
      session.migrateOut = null;
      this.push(session);
    }
  }

  // ── bookkeeping ────────────────────────────────────────────────────────────────────────

  /** Keeps `owners` in step with a record, touching only the hosts it changes. */
  trackOwners(before: DurableState, record: JournalRecord): void {
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
      case "job-scheduled":
      case "plan":
      case "snapshot":
        return;
      default:
        return assertNever(record);
    }
  }

  /** Jobs still registering, the connected workers, the hosts of lost ones and each job's progress, for the status report. */
  /** The workers job `jobId` has: its hosts once it started, those registered so far before. */
  workersOf(jobId: string): number {
    const job = this.state.jobs.get(jobId);
    return job ? job.groups.reduce((sum, group) => sum + group.length, 0) : (this.pendingJobs.get(jobId)?.workers.size ?? 0);
  }

  view(): {
    registering: { id: string; hosts: number[]; expected: number }[];
    workers: number;
    lost: Map<string, number[]>;
    progress: Map<string, JobProgress>;
  } {
    const lost = new Map<string, number[]>();
    const progress = new Map<string, JobProgress>();
    for (const s of this.workers.values()) {
      if (s.lost) lost.set(s.job, [...(lost.get(s.job) ?? []), s.host]);
      if (s.step === null) continue;
      const seen = progress.get(s.job);
      const stepSeconds = s.stepMs === null ? null : s.stepMs / 1000;
      progress.set(s.job, { step: Math.max(seen?.step ?? 0, s.step), stepSeconds: maxOrNull(seen?.stepSeconds ?? null, stepSeconds) });
    }
    return {
      registering: [...this.pendingJobs].map(([id, p]) => ({ id, hosts: [...p.workers.keys()], expected: p.parallelism.pp * p.parallelism.dp })),
      workers: this.workers.size,
      lost,
      progress,
    };
  }

  /** The worker's session, made if it has none; every request from a worker comes through here, so it was heard now. */
  private session(job: string, host: number): WorkerSession {
    let session = this.workers.get(host);
    const now = this.context.clock();
    if (!session || session.job !== job) {
      session = {
        job,
        host,
        peer: null,
        step: null,
        stepMs: null,
        reportedAt: now,
        advancing: false,
        generation: -1,
        hold: null,
        heldRegister: null,
        migrateOut: null,
        heardAt: now,
        heartbeats: false,
        lost: false,
      };
      this.workers.set(host, session);
    }
    if (session.lost) this.context.log.info(() => `worker of job ${job} on host ${host} is back`);
    this.unheard.delete(job);
    session.heardAt = now;
    session.lost = false;
    return session;
  }
}

const maxOrNull = (a: number | null, b: number | null): number | null => (a === null ? b : b === null ? a : Math.max(a, b));
