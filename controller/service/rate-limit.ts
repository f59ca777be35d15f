/**
 * A token bucket per client: each holds up to `burst` requests and refills at `perSecond`.
 * The table holds at most `clients` buckets; when it is full the client heard from least
 * recently is forgotten (it comes back with a full bucket), so no number of client identities
 * grows it. Pure: the caller passes the time.
 */
export interface RateLimits {
  readonly perSecond: number;
  readonly burst: number;
  readonly clients: number;
}

/**
 * Generous for every legitimate peer (a launcher sends one barrier per step and waits for its
 * answer, a daemon a heartbeat a second), small enough that one peer cannot fill the event loop.
 */
export const DEFAULT_RATE_LIMITS: RateLimits = { perSecond: 1_000, burst: 2_000, clients: 10_000 };

interface Bucket {
  tokens: number;
  at: number;
  /** Whether the last request was refused: the caller reports the first refusal of a run only. */
  limited: boolean;
}

/** What `take` decided: `allow`, `refuse`, or `refuse-first` for the first refusal after allowed requests. */
export type RateDecision = "allow" | "refuse" | "refuse-first";

export class RateLimiter {
  private readonly buckets = new Map<string, Bucket>();

  constructor(private readonly limits: RateLimits = DEFAULT_RATE_LIMITS) {}

  /**
   * Takes one token from `client`'s bucket at time `nowMs`. `scale` multiplies its rate and
   * burst: one bucket standing for that many peers' requests.
   */
  take(client: string, nowMs: number, scale = 1): RateDecision {
    const { clients } = this.limits;
    const perSecond = this.limits.perSecond * scale;
    const burst = this.limits.burst * scale;
    const known = this.buckets.get(client);
    const bucket = known ?? { tokens: burst, at: nowMs, limited: false };
    // Re-inserting keeps the map in order of last use, so its first key is the one to evict.
    this.buckets.delete(client);
    this.buckets.set(client, bucket);
    if (!known && this.buckets.size > clients) {
      const oldest = this.buckets.keys().next().value;
      if (oldest !== undefined) this.buckets.delete(oldest);
    }
    bucket.tokens = Math.min(burst, bucket.tokens + (Math.max(0, nowMs - bucket.at) * perSecond) / 1000);
    bucket.at = nowMs;
    if (bucket.tokens >= 1) {
      bucket.tokens -= 1;
      bucket.limited = false;
      return "allow";
    }
    const first = !bucket.limited;
    bucket.limited = true;
    return first ? "refuse-first" : "refuse";
  }

  /** Clients with a bucket; at most `limits.clients`. */
  get size(): number {
    return this.buckets.size;
  }
}
