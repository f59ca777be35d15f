/**
 * Which hosts' daemons vouched, lately, that a launcher of a job runs on their host (over the
 * host's local socket, which only processes on that host reach). With `--require-vouch` a job
 * takes a new worker only on such a host, so a credential alone cannot claim hosts its job
 * does not run on. Pure: the caller passes the time.
 */

/** How long a vouch admits registrations: a launcher registers right after it is vouched for. */
export const VOUCH_TTL_MS = 60_000;
/** Vouches kept at once; past it the oldest is forgotten (its launcher asks again). */
export const MAX_VOUCHES = 65_536;

export class Vouches {
  /** When each job-and-host pair was vouched for, oldest first. */
  private readonly at = new Map<string, number>();

  add(job: string, host: number, nowMs: number): void {
    const key = `${host}\u0000${job}`;
    // Re-inserting keeps the map in order of vouching, so its first key is the oldest.
    this.at.delete(key);
    this.at.set(key, nowMs);
    if (this.at.size > MAX_VOUCHES) this.at.delete(this.at.keys().next().value!);
  }

  /** Whether host `host`'s daemon vouched for a launcher of `job` within the last `VOUCH_TTL_MS`. */
  holds(job: string, host: number, nowMs: number): boolean {
    const at = this.at.get(`${host}\u0000${job}`);
    return at !== undefined && nowMs - at < VOUCH_TTL_MS;
  }
}
