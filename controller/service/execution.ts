import { rackFragmentation, withinBounds } from "../planner/model/fragmentation.ts";
import type { Cluster } from "../planner/model/cluster.ts";
import type { Plan } from "../planner/plan/planner.ts";
import { applyMoves, PlanError } from "../planner/plan/check.ts";
import { ProtocolError } from "../../sdk/contract/protocol/errors.ts";
import type { ReplacementExited, TransferResult } from "../../sdk/contract/protocol/daemon.ts";
import type { ControllerContext, ReplyTarget } from "./context.ts";
import type { DaemonLiveness } from "./liveness.ts";
import { DaemonCommandError } from "./daemon-hosts.ts";
import {
  assertNever,
  isCommitted,
  isFinished,
  transition,
  type Migration,
  type MigrationAction,
  type MigrationEvent,
  type MigrationTimeouts,
} from "./migration.ts";
import type { PlanRunner } from "./plan-thread.ts";
import { recoverMigrations } from "./recovery.ts";
import type { SessionMoves, WorkerSessions } from "./sessions.ts";
import { pinnedJobs, type SchedulerWatch } from "./scheduler-watch.ts";
import { placeAfter, placeOf } from "./assignment.ts";
import { clusterOf } from "./state.ts";
import { decideStep } from "./steps.ts";
import type { HostScheduler, ReplacementLauncher, StagingTransport } from "./transport.ts";

/**
 * Plan execution: plans when placement breaks a bound, drives the active plan's moves step
 * by step (`decideStep`), feeds each move's events to its state machine (`transition`) and
 * carries out the actions it returns: holding and releasing workers, re-forming jobs, and
 * the commands to the hosts' daemons (staging, replacements), which all go out from
 * `prepareStaging`, `releaseStaging` and `spawnReplacement`.
 */

export interface ExecutionOptions {
  readonly planner: PlanRunner;
  readonly transport: StagingTransport;
  readonly launcher: ReplacementLauncher;
  /** The local user a job's replacements run as, where the operator named one (`monkeytree keys --job J --user U`). */
  readonly jobUser?: (job: string) => string | null;
  /** The scheduler that owns the hosts, if any: holds destinations, takes back sources. */
  readonly scheduler: HostScheduler | null;
  /** Its latest view of the cluster, with `scheduler`. */
  readonly watch: SchedulerWatch | null;
  /** Hosts that never take a worker (empty slots), besides those the scheduler names. */
  readonly unavailable: readonly number[];
  readonly timeouts: MigrationTimeouts;
  readonly planTimeLimitMs: number;
  /** Steps a job still trains after its move starts, before all its workers stop together. */
  readonly stopLeadSteps: number;
  /** How long after a rollback or a restart to plan again. */
  readonly replanBackoffMs: number;
}

interface Planning {
  /** The placement the plan is computed for (`placementKey`). */
  readonly placement: string;
  /** Hosts whose daemon was lost while it was computed. */
  readonly lost: number[];
}

export class PlanExecution implements SessionMoves {
  private replanWanted = false;
  /** When to plan again after a rollback or restart; null when nothing is scheduled. */
  private replanAt: number | null = null;
  /** The hosts whose daemon was lost at the last tick. */
  private lostHosts: readonly number[] = [];
  /** Set when a plan's moves are all finished, so it is not driven again. */
  private settledPlan: string | null = null;
  /**
   * The plan the planner's thread is computing, and what it was asked for. Not journaled: a
   * restart plans afresh. Daemons lost meanwhile are noted, since the placement shows no loss.
   */
  private planning: Planning | null = null;
  private closed = false;
  /** Jobs whose re-formation waits for their master's daemon to register again after a restart. */
  private readonly awaitingMaster = new Set<string>();

  constructor(
    private readonly context: ControllerContext,
    private readonly sessions: WorkerSessions,
    private readonly daemons: DaemonLiveness,
    private readonly options: ExecutionOptions,
  ) {}

  /** Settles the moves a previous controller left in flight; run once, at start. */
  recover(): void {
    const recovery = recoverMigrations(this.context.state, this.context.clock());
    for (const line of recovery.log) this.context.log.warn(() => line);
    for (const m of recovery.migrations) {
      const before = this.context.state.migrations.get(m.id);
      this.context.record({ kind: "migration", migration: m });
      if (before) this.schedulerBooks(before, m);
    }
    // A committed move's hold and give-back may not have reached the scheduler before the
    // restart; both are idempotent, so they are asked for again.
    for (const m of this.openMigrations()) if (isCommitted(m.state)) this.committedBooks(m);
    for (const action of recovery.actions) this.execute(action);
    if (this.context.state.jobs.size) this.replanLater();
  }

  replanSoon(): void {
    this.replanWanted = true;
  }

  /**
   * The scheduler's view changed: plan again. Its first view (after a start or a restart)
   * does not cut short a backoff already scheduled, which keeps a restart from pausing jobs at once.
   */
  schedulerChanged(first: boolean): void {
    if (!first || this.replanAt === null) this.replanWanted = true;
  }

  replanIfWanted(): void {
    if (this.replanWanted) this.replan();
  }

  /** The daemon on `host` went silent: moves from or to it cannot finish. */
  hostLost(host: number): void {
    this.planning?.lost.push(host);
    for (const m of this.openMigrations()) {
      if (m.from === host || m.to === host) this.fire(m.id, { type: "fail", reason: `the daemon on host ${host} was lost` });
    }
  }

  /**
   * Moves past their deadline fail, and a replan scheduled for now is asked for, as is one when
   * a lost daemon came back: its host may take a worker again.
   */
  checkDeadlines(now: number): void {
    for (const m of this.openMigrations()) this.fire(m.id, { type: "tick" });
    const lost = this.daemons.lostHosts();
    // A loss fails the moves it concerns, and their rollback plans again after its backoff.
    if (this.lostHosts.some((host) => !lost.includes(host)) && this.replanAt === null) this.replanWanted = true;
    this.lostHosts = lost;
    if (this.replanAt !== null && now >= this.replanAt) {
      this.replanAt = null;
      this.replanWanted = true;
      this.context.wake();
    }
    this.drive();
  }

  transferResult(target: ReplyTarget, req: TransferResult): void {
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
    this.context.ack(target);
  }

  /**
   * A replacement launcher ended. Until its workers registered (`resuming`), its move cannot
   * finish: one not yet committed rolls back now, and a committed one raises its alert now,
   * rather than either waiting out its state's deadline. Later exits are the job's own end or
   * the worker's loss, which the worker's liveness covers; a token no move holds any longer is
   * a finished move's.
   */
  replacementExited(target: ReplyTarget, req: ReplacementExited): void {
    const m = this.context.state.migrations.get(req.migration);
    // Its token is the move's unless the move has not taken the grant in yet: the daemon
    // starts the launcher as it answers the prepare, and a launcher that fails at once may be
    // heard of first.
    const ours = m !== undefined && m.to === req.host && (m.token === null || m.token === req.token);
    if (ours && !isFinished(m.state) && m.state !== "resuming") {
      const how = req.signal ?? `code ${req.code ?? "unknown"}`;
      this.fire(m.id, {
        type: "fail",
        reason: `the replacement launcher on host ${req.host} exited (${how}) before its workers registered; its output is in the log of host ${req.host}'s daemon`,
      });
    }
    this.context.ack(target);
  }

  /** Stops planning: a plan in flight is dropped, as a restart would drop it. */
  close(): Promise<void> {
    this.closed = true;
    return this.options.planner.close();
  }

  /**
   * The cluster the planner sees: MonkeyTree's started jobs, the scheduler's pinned jobs (never
   * moved) and every unavailable host; null under a scheduler that has not been looked at yet.
   */
  private cluster(): Cluster | null {
    const view = this.options.watch ? this.options.watch.view : null;
    if (this.options.watch && view === null) return null;
    // A host whose daemon is lost can take no checkpoint: it is no destination until the daemon is back.
    const unavailable = new Set([...this.options.unavailable, ...(view?.unavailable.map((u) => u.host) ?? []), ...this.daemons.lostHosts()]);
    return clusterOf(this.context.state, pinnedJobs(this.context.state, view), [...unavailable]);
  }

  /**
   * Starts a plan on the planner's thread when the placement breaks a bound. One plan at a
   * time: an event meanwhile leaves `replanWanted` set, and the answer is checked against
   * the placement it was computed for (`planned`).
   */
  private replan(): void {
    this.replanWanted = false;
    if (this.planning || this.activeMoves().length) {
      this.replanWanted = true;
      return;
    }
    const cluster = this.cluster();
    // Under a scheduler, the cluster is unknown until its first view: the plan waits for it.
    if (cluster === null) {
      this.replanWanted = true;
      return;
    }
    if (withinBounds(cluster)) return;
    const planning = { placement: placementKey(cluster), lost: [] };
    this.planning = planning;
    this.context.log.info(() => `fragmentation over λ ${cluster.lambda}: planning for ${cluster.groups.length} groups on ${cluster.hostCount} hosts`);
    this.options.planner.plan(cluster, this.options.planTimeLimitMs).then(
      (plan) => this.closed || this.later(() => this.planned(planning, cluster, plan)),
      (error: unknown) =>
        this.closed ||
        this.later(() => {
          this.planning = null;
          this.context.log.error(() => `planning failed, trying again later: ${message(error)}`);
          this.context.observer.planFailed(message(error));
          this.replanLater();
        }),
    );
  }

  /**
   * A plan came back. It is applied only to the placement it was computed for, with the
   * daemons it knew: a job that started or ended, a move that committed or a daemon lost
   * meanwhile makes it stale, and the controller plans again instead.
   */
  private planned(planning: Planning, cluster: Cluster, plan: Plan): void {
    this.planning = null;
    this.context.log.info(
      () => `fragmentation over λ ${cluster.lambda}: plan ${plan.status}, ${plan.moveCount} moves in ${plan.steps} steps (${plan.solveMs.toFixed(0)} ms)`,
    );
    const now = this.cluster();
    const stale = planning.lost.length
      ? `the daemons on hosts ${planning.lost.join(", ")} were lost`
      : now === null || placementKey(now) !== planning.placement
        ? "the placement changed"
        : null;
    if (stale) {
      this.context.log.info(() => `plan discarded: ${stale} while it was computed; planning again`);
      this.replanWanted = true;
      this.context.wake();
      return;
    }
    // A planner that breaks the plan contract (a pinned job moved, an unavailable or busy
    // destination, a source that runs no such worker) must not have its plan carried out.
    try {
      applyMoves(cluster, plan.moves);
    } catch (err) {
      if (!(err instanceof PlanError)) throw err;
      this.context.log.error(() => `the plan is invalid (${err.message}); it is not carried out`);
      this.context.observer.planFailed(`the plan is invalid: ${err.message}`);
      this.replanLater();
      return;
    }
    const id = plan.moves.length ? `p${this.context.state.plans}` : null;
    this.context.observer.planned({
      plan: id,
      status: plan.status,
      moves: plan.moveCount,
      steps: plan.steps,
      seconds: plan.solveMs / 1000,
      fragmentation: rackFragmentation(cluster),
      lambda: cluster.lambda,
    });
    if (id === null) return;
    this.context.record({ kind: "plan", plan: id, moves: plan.moves.map((m) => ({ ...m })) });
  }

  /**
   * Advances the active plan as far as the current facts allow. Each round moves some move
   * forward, and moves wait on workers and hosts after a few rounds; the bound only keeps a
   * bug from spinning the event loop.
   */
  drive(): void {
    for (let round = 0; round < 16; round++) {
      const moves = this.activeMoves();
      if (moves.length === 0) return;
      const decision = decideStep(moves);
      switch (decision.type) {
        case "start":
          for (const id of decision.ids) this.fire(id, { type: "start" });
          continue;
        case "pause":
          for (const id of decision.ids) {
            const m = this.context.state.migrations.get(id);
            if (m) this.fire(id, { type: "pause", stopStep: this.stopStepFor(m.job) });
          }
          continue;
        case "commit":
          // Every host of the step's jobs seals its hold first, so none can let go of it by
          // itself once the move has committed.
          if (!this.sealed(decision.ids)) return;
          for (const id of decision.ids) this.fire(id, { type: "commit" });
          continue;
        case "abort":
          for (const id of decision.ids) this.fire(id, { type: "fail", reason: decision.reason });
          continue;
        case "finished":
          this.settledPlan = this.context.state.activePlan;
          this.context.log.info(() => `plan ${this.context.state.activePlan} ${decision.outcome === "done" ? "done" : "rolled back"}`);
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

  /** Whether the jobs of these moves sealed their holds; asks them to, when they have not. */
  private sealed(ids: readonly string[]): boolean {
    const jobs = new Set(ids.flatMap((id) => this.context.state.migrations.get(id)?.job ?? []));
    for (const job of jobs) this.sessions.seal(job);
    return [...jobs].every((job) => this.sessions.sealed(job));
  }

  raised(jobId: string, step: number): void {
    for (const m of this.openMigrations()) if (m.job === jobId) this.fire(m.id, { type: "raise", stopStep: step });
  }

  /** Fires `paused` for moves whose job has every worker held at its stop step. */
  private checkPaused(moves: readonly Migration[]): boolean {
    let fired = false;
    for (const m of moves) {
      if (m.state !== "pausing" || !this.sessions.jobHeld(m.job)) continue;
      this.fire(m.id, { type: "paused" });
      fired = true;
    }
    return fired;
  }

  /** The barrier the job's workers stop at: past the furthest one they have reached by now. */
  private stopStepFor(jobId: string): number {
    // The job may train on for the lead's steps after its replacement is ready.
    return this.sessions.heldAt(jobId) ?? this.sessions.projectedStep(jobId) + 1 + this.options.stopLeadSteps;
  }

  activeMoves(): Migration[] {
    const { state } = this.context;
    const plan = state.activePlan;
    if (plan === null || plan === this.settledPlan) return [];
    return state.activeMoves.flatMap((id) => state.migrations.get(id) ?? []);
  }

  /** Only the active plan can have moves in flight: a plan ends when all of its moves have. */
  openMigrations(): Migration[] {
    return this.activeMoves().filter((m) => !isFinished(m.state));
  }

  fire(id: string, event: MigrationEvent): void {
    const m = this.context.state.migrations.get(id);
    if (!m) return;
    const step = transition(m, event, this.context.clock(), this.options.timeouts);
    if (step.log) {
      const line = step.log;
      if (step.migration.state === "rolled-back" || step.actions.some((a) => a.type === "alert")) this.context.log.warn(() => line);
      else this.context.log.info(() => line);
    }
    if (step.migration !== m) {
      this.context.record({ kind: "migration", migration: step.migration });
      this.schedulerBooks(m, step.migration);
    }
    for (const action of step.actions) this.execute(action);
  }

  /**
   * The scheduler's side of a move's transition, run once the record is durable: a committed
   * move gives its source back (keeping the destination's hold for the worker now there), a
   * rolled-back one releases its hold. A failure is logged: the scheduler keeps a node busy
   * that is free, which wastes it but hands no host to two jobs.
   */
  private schedulerBooks(before: Migration, after: Migration): void {
    if (!isCommitted(before.state) && isCommitted(after.state)) this.committedBooks(after);
    else if (before.state !== "rolled-back" && after.state === "rolled-back") this.rolledBackBooks(after);
  }

  private committedBooks(m: Migration): void {
    const scheduler = this.options.scheduler;
    if (!scheduler) return;
    this.context.effect(() => {
      scheduler.hold(m.job, m.id, m.to).catch(this.warn(m, `keeping host ${m.to} held in the scheduler`));
      scheduler.giveBack(m.job, m.from).catch(this.warn(m, `giving host ${m.from} back to the scheduler`));
    });
  }

  private rolledBackBooks(m: Migration): void {
    const scheduler = this.options.scheduler;
    if (!scheduler) return;
    this.context.effect(() => void scheduler.release(m.job, m.id).catch(this.warn(m, `releasing the hold on host ${m.to}`)));
  }

  private warn(m: Migration, what: string): (error: unknown) => void {
    return (error) => this.context.log.warn(() => `migration ${m.id}: ${what}: ${message(error)}`);
  }

  private execute(action: MigrationAction): void {
    switch (action.type) {
      case "hold-job":
        return this.sessions.hold(action.job, action.stop, action.step, action.sealed === true);
      case "prepare-staging":
        return this.prepareStaging(action);
      case "migrate-out":
        return this.sessions.migrateOut(action.from, {
          migration: action.migration,
          to: action.to,
          endpoint: action.endpoint,
          token: action.token,
          step: action.step,
        });
      case "release-staging":
        return this.releaseStaging(action);
      case "stop-source":
        return this.sessions.stopSource(action.host);
      case "spawn-replacement":
        return this.spawnReplacement(action);
      case "reconfigure-job":
        return this.reconfigureJob(action.job);
      case "resume-job":
        return this.sessions.resume(action.job);
      case "alert":
        this.context.log.error(() => `migration ${action.migration}: ${action.message}`);
        return;
      default:
        return assertNever(action);
    }
  }

  /**
   * Re-forms the job once every replacement of its committed moves has registered: held
   * workers get `reconfigure`, replacements their assignment, all with the new generation.
   */
  reconfigureJob(jobId: string): void {
    const job = this.context.state.jobs.get(jobId);
    if (!job) return;
    if (this.activeMoves().some((m) => m.job === jobId && m.state === "committing")) return;
    // Every assignment names the master's address, which its daemon gives. After a restart the
    // job re-forms once that daemon has registered again (or could have), not before.
    const master = job.groups[0]?.[0];
    if (master !== undefined && this.daemons.addressOf(master) === null) {
      if (this.awaitingMaster.has(jobId)) return;
      this.awaitingMaster.add(jobId);
      const reform = () =>
        this.later(() => {
          this.awaitingMaster.delete(jobId);
          this.reform(jobId);
        });
      this.daemons.registered(master).then(reform, reform);
      return;
    }
    this.reform(jobId);
  }

  private reform(jobId: string): void {
    const job = this.context.state.jobs.get(jobId);
    if (!job) return;
    this.sessions.reform(job);
    this.checkResumed(jobId);
  }

  checkResumed(jobId: string): void {
    const job = this.context.state.jobs.get(jobId);
    if (!job) return;
    const resuming = this.activeMoves().filter((m) => m.job === jobId && m.state === "resuming");
    if (resuming.length === 0) return;
    if (!this.sessions.current(job)) return;
    for (const m of resuming) this.fire(m.id, { type: "resumed" });
  }

  // ── commands to the hosts' daemons ─────────────────────────────────────────────────────
  // Each runs as an effect: only once the records that led to it are durable, and once the
  // host's daemon is registered (after a restart the daemons register again, see
  // `DaemonLiveness.registered`; one that does not come back fails the command).

  private prepareStaging(action: Extract<MigrationAction, { type: "prepare-staging" }>): void {
    const m = this.context.state.migrations.get(action.migration);
    const job = m && this.context.state.jobs.get(m.job);
    const place = m && placeAfter(this.context.state, m);
    if (!m || !job || !place) return this.later(() => this.fire(action.migration, { type: "fail", reason: "its job ended before staging" }));
    const capacity = this.daemons.stagingBytes(action.host);
    if (capacity !== undefined && capacity < action.bytes) {
      const reason = `host ${action.host} stages at most ${capacity} bytes; the checkpoint has ${action.bytes}`;
      return this.context.effect(() => this.later(() => this.fire(action.migration, { type: "fail", reason })));
    }
    const scheduler = this.options.scheduler;
    // The destination is held first, so the scheduler starts no other job there while it stages.
    // The job's user as its scheduler knows it, else as the operator wrote it beside its key.
    const held = (): Promise<string | null> =>
      (scheduler ? scheduler.hold(m.job, m.id, action.host) : Promise.resolve()).then(
        (hold) => hold?.user ?? this.options.jobUser?.(m.job) ?? null,
        (error: unknown) => {
          throw new Error(`the scheduler would not hold it (${message(error)})`);
        },
      );
    this.context.effect(() =>
      held()
        .then((user) =>
          this.daemons.registered(action.host).then(() =>
            this.options.transport.prepare({
              migration: action.migration,
              host: action.host,
              bytes: action.bytes,
              replacement: { job: m.job, group: m.group, parallelism: job.parallelism, place, replacement: job.replacement, user },
            }),
          ),
        )
        .then(
          (grant) => this.later(() => this.fire(action.migration, { type: "staging-ready", endpoint: grant.endpoint, token: grant.token })),
          (error: unknown) => this.later(() => this.fire(action.migration, { type: "fail", reason: `host ${action.host} could not stage: ${message(error)}` })),
        ),
    );
  }

  private releaseStaging(action: Extract<MigrationAction, { type: "release-staging" }>): void {
    this.sessions.refuseEarly(action.token, "its migration rolled back");
    this.context.effect(() => void this.release(action.host, action.token, 1));
  }

  /**
   * Frees a rolled-back move's staging on `host`. A release is idempotent on the daemon, so one
   * that went unanswered (the host cut off, as a daemon is when its move rolls back) is sent
   * again when the daemon is next heard from, up to `MAX_RELEASE_ATTEMPTS` times: unreleased,
   * the staging stays reserved for as long as the daemon runs.
   */
  private release(host: number, token: string, attempt: number): Promise<void> {
    return this.daemons
      .registered(host)
      .then(() => this.options.transport.release(host, token))
      .catch((error: unknown) => {
        const again = error instanceof DaemonCommandError && error.code === "timeout" && attempt < MAX_RELEASE_ATTEMPTS;
        this.context.log.warn(() => `releasing staging on host ${host}: ${message(error)}${again ? "; sending it again once the daemon is heard from" : ""}`);
        if (again) this.daemons.whenHeard(host, () => this.context.effect(() => void this.release(host, token, attempt + 1)));
      });
  }

  private spawnReplacement(action: Extract<MigrationAction, { type: "spawn-replacement" }>): void {
    const early = this.sessions.takeEarly(action.token);
    // After the whole step committed, when the host's previous worker has left it.
    if (early) this.later(() => this.sessions.admitEarly(action.token, early));
    const job = this.context.state.jobs.get(action.job);
    const place = job && placeOf(job, action.host);
    if (!job || !place)
      return this.later(() => this.fire(action.migration, { type: "fail", reason: `job "${action.job}" ended before its replacement started` }));
    this.context.effect(() =>
      this.daemons
        .registered(action.host)
        .then(() =>
          this.options.launcher.spawn({
            migration: action.migration,
            job: action.job,
            group: action.group,
            parallelism: job.parallelism,
            place,
            replacement: job.replacement,
            host: action.host,
            token: action.token,
          }),
        )
        .catch((error: unknown) =>
          this.later(() => this.fire(action.migration, { type: "fail", reason: `spawning the replacement on host ${action.host}: ${message(error)}` })),
        ),
    );
  }

  /** Work that arrives outside a request (a host's answer, a plan): handle it, then drive. */
  private later(run: () => void): void {
    this.context.safely("handling an answer from a host or the planner", () => {
      run();
      this.drive();
    });
  }

  private replanLater(): void {
    this.replanAt = this.context.clock() + this.options.replanBackoffMs;
  }
}

/**
 * Which groups run where, which of them may move and where none may go: two clusters with the
 * same key get the same plan, and a change in the scheduler's pinned jobs or unavailable hosts
 * changes it as a started job does.
 */
const placementKey = (cluster: Cluster): string => JSON.stringify([cluster.groups, cluster.placement, cluster.unavailable]);

/** How often a rolled-back move's staging release is sent to a daemon that does not answer it. */
const MAX_RELEASE_ATTEMPTS = 5;

const message = (error: unknown): string => (error instanceof Error ? error.message : String(error));
