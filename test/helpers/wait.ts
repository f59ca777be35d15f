/**
 * The bound on a wait for a state that processes bring about: Node starting a program under
 * tsx, the controller's planner thread loading HiGHS at a low priority, a checkpoint crossing
 * a socket. On a 2-core machine at a load of 20 each takes many times what it takes on an
 * idle one (the first plan alone, tens of seconds), so this is a safety net against a hang,
 * never an estimate of the work: a test that waits longer has a bug.
 */
export const SAFETY_NET_MS = 120_000;

/** `expect.poll`'s options for a wait bounded by `SAFETY_NET_MS`. */
export const patiently = { timeout: SAFETY_NET_MS, interval: 100 } as const;
