import { ProtocolError } from "../../sdk/contract/protocol/errors.ts";
import type { Heartbeat, HostRegister } from "../../sdk/contract/protocol/daemon.ts";
import { parseTransferEndpoint } from "../../sdk/contract/protocol/endpoint.ts";
import type { ControllerContext, ReplyTarget } from "./context.ts";

/**
 * Daemon liveness: which hosts have a registered daemon, what each advertised (its network
 * address, its staging capacity), and which went silent. None of it is durable; after a
 * restart it comes back as the daemons register again, and commands to a host wait for that
 * (`registered`).
 */

interface DaemonSession {
  /** The daemon process's own id, fixed for its lifetime: tells its resends from a second daemon. */
  readonly incarnation: string;
  lastSeen: number;
  lost: boolean;
  /** The host's network address, from the transfer endpoint its daemon advertises. */
  address: string | null;
  /** Size of the host's pre-allocated staging buffer: the largest checkpoint it can take. */
  readonly stagingBytes: number;
}

interface Waiter {
  readonly resolve: () => void;
  readonly reject: (error: Error) => void;
}

export class DaemonLiveness {
  private readonly daemons = new Map<number, DaemonSession>();
  /** Commands waiting for their host's daemon to register again after a restart, by host. */
  private readonly waiting = new Map<number, Waiter[]>();
  /** What waits for its host's daemon to be heard from again, by host (`whenHeard`). */
  private readonly hearing = new Map<number, (() => void)[]>();
  /**
   * Until when commands wait for a host's daemon after a restart: a live daemon hears from the
   * new controller within a heartbeat and registers again, so one silent for a heartbeat
   * timeout is lost, as it would be while registered. Null on a first start (no daemon is
   * expected back) and once that time has passed.
   */
  private waitUntil: number | null;

  constructor(
    private readonly context: ControllerContext,
    /** A daemon silent for this long is declared lost. */
    private readonly heartbeatTimeoutMs: number,
    private readonly onRegistered: (host: number, peer: Uint8Array, endpoint: string) => void,
  ) {
    // Records beyond the config mean a predecessor ran, and its daemons are coming back.
    this.waitUntil = context.state.records > 1 ? context.clock() + heartbeatTimeoutMs : null;
  }

  /**
   * A host has one daemon at a time. The same daemon process (same incarnation) may register
   * again, after a lost reply, a reconnection or a controller restart, and its commands follow
   * its newest connection. Another one is refused while the first is live, never re-routed to:
   * a restarted daemon gets in once the old one's heartbeats have lapsed.
   */
  register(target: ReplyTarget, req: HostRegister): void {
    const hostCount = this.context.state.topology.racks * this.context.state.topology.hostsPerRack;
    if (req.host >= hostCount) throw new ProtocolError("malformed", `host ${req.host} is out of range: the cluster has hosts 0..${hostCount - 1}`);
    const now = this.context.clock();
    const current = this.daemons.get(req.host);
    if (current && current.incarnation !== req.incarnation && !this.lapsed(current, now)) {
      throw new ProtocolError(
        "conflict",
        `host ${req.host} already has a live daemon (last heard ${now - current.lastSeen} ms ago); it must stop, or miss heartbeats for ${this.heartbeatTimeoutMs} ms, before another daemon registers the host`,
      );
    }
    this.daemons.set(req.host, { incarnation: req.incarnation, lastSeen: now, lost: false, stagingBytes: req.stagingBytes, address: addressIn(req.endpoint) });
    this.onRegistered(req.host, target.peer, req.endpoint);
    this.context.log.info(() => `daemon on host ${req.host} registered (${req.stagingBytes} staging bytes at ${req.endpoint})`);
    for (const waiter of this.waiting.get(req.host) ?? []) waiter.resolve();
    this.waiting.delete(req.host);
    this.heard(req.host);
    this.context.ack(target);
  }

  /**
   * Resolves once `host` has a registered daemon, so a command can go to it. After a restart
   * that may take until the daemon's next heartbeat; past the heartbeat timeout it rejects,
   * naming the host, as for a lost daemon. Otherwise it resolves at once, and a host without
   * a daemon is refused by the transport, which names it.
   */
  registered(host: number): Promise<void> {
    if (this.waitUntil === null || this.daemons.has(host)) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const waiters = this.waiting.get(host) ?? [];
      waiters.push({ resolve, reject });
      this.waiting.set(host, waiters);
    });
  }

  heartbeat(target: ReplyTarget, req: Heartbeat): void {
    const daemon = this.sender(req, "its heartbeats do not keep that one alive");
    if (daemon.lost) this.context.log.info(() => `daemon on host ${req.host} is back`);
    daemon.lastSeen = this.context.clock();
    daemon.lost = false;
    this.heard(req.host);
    this.context.ack(target);
  }

  /**
   * Calls `then` when the daemon of `host` is next heard from (a heartbeat or a registration):
   * for a command that went unanswered while the host was cut off, to be sent again once it
   * can arrive.
   */
  whenHeard(host: number, then: () => void): void {
    this.hearing.set(host, [...(this.hearing.get(host) ?? []), then]);
  }

  private heard(host: number): void {
    const calls = this.hearing.get(host);
    this.hearing.delete(host);
    for (const call of calls ?? []) call();
  }

  /** Throws unless `req` comes from the daemon registered for its host; `what` says what it then cannot do. */
  sender(req: Pick<Heartbeat, "host" | "incarnation">, what: string): DaemonSession {
    const daemon = this.daemons.get(req.host);
    if (!daemon) throw new ProtocolError("unknown_worker", `host ${req.host} has no registered daemon; send daemon.register first`);
    if (daemon.incarnation !== req.incarnation)
      throw new ProtocolError("conflict", `host ${req.host} is registered by another daemon; this one is not, and ${what}`);
    return daemon;
  }

  /** Hosts whose daemon went silent and has not been heard from since, in order. */
  lostHosts(): number[] {
    return [...this.daemons]
      .filter(([, daemon]) => daemon.lost)
      .map(([host]) => host)
      .sort((a, b) => a - b);
  }

  /**
   * Declares lost every daemon silent past the timeout, calling `lost` for each as it does.
   * The last `deafMs` the controller did not listen: that time counts toward no timeout.
   */
  checkHeartbeats(now: number, deafMs: number, lost: (host: number) => void): void {
    if (this.waitUntil !== null && now >= this.waitUntil) this.stopWaiting();
    for (const [host, daemon] of this.daemons) {
      daemon.lastSeen += deafMs;
      if (daemon.lost || !this.lapsed(daemon, now)) continue;
      daemon.lost = true;
      this.context.log.warn(() => `daemon on host ${host} lost: no heartbeat for ${now - daemon.lastSeen} ms`);
      this.context.observer.daemonLost(host, now - daemon.lastSeen);
      lost(host);
    }
  }

  private lapsed(daemon: DaemonSession, now: number): boolean {
    return daemon.lost || now - daemon.lastSeen >= this.heartbeatTimeoutMs;
  }

  /** Fails the commands whose host's daemon did not come back in time after the restart. */
  private stopWaiting(): void {
    this.waitUntil = null;
    for (const [host, waiters] of [...this.waiting].sort(([a], [b]) => a - b)) {
      const error = new Error(`the daemon on host ${host} did not register within ${this.heartbeatTimeoutMs} ms of the controller's restart`);
      this.context.log.warn(() => `${error.message}; its daemon is lost`);
      for (const waiter of waiters) waiter.reject(error);
    }
    this.waiting.clear();
  }

  /** The host's network address as its daemon advertised it; null before it registered. */
  readonly addressOf = (host: number): string | null => this.daemons.get(host)?.address ?? null;

  /** The largest checkpoint the host's daemon can stage; undefined before it registered. */
  stagingBytes(host: number): number | undefined {
    return this.daemons.get(host)?.stagingBytes;
  }

  /** Every registered daemon, for the status report. */
  view(): { host: number; lost: boolean }[] {
    return [...this.daemons].map(([host, d]) => ({ host, lost: d.lost }));
  }
}

const addressIn = (endpoint: string): string | null => parseTransferEndpoint(endpoint)?.host ?? null;
