import { ControllerError, type ControllerClient } from "../client.ts";
import type { Logger } from "../log.ts";
import type { WorkerIdentity } from "../protocol/worker.ts";

/** How often a launcher heartbeats: well below the controller's worker heartbeat timeout (10 s by default). */
export const WORKER_HEARTBEAT_MS = 2_000;

/**
 * Tells the controller every `intervalMs` that this worker's launcher lives, on a timer of its
 * own, whatever the training does meanwhile: barriers come only between steps, and a step, a
 * model load or a checkpoint on its way may take longer than the controller waits. A beat waits
 * for its answer only until the next one is due, which stands in for it; a controller that does
 * not answer is for the barriers to report. Returns the function that stops the beats.
 */
export function startHeartbeat(client: ControllerClient, worker: WorkerIdentity, log: Logger, intervalMs = WORKER_HEARTBEAT_MS): () => void {
  const beat = () => {
    client.request({ type: "worker.heartbeat", worker }, intervalMs).catch((error: unknown) => {
      if (error instanceof ControllerError) log.debug(() => `the controller refused a heartbeat: ${error.message}`);
    });
  };
  beat();
  const timer = setInterval(beat, intervalMs);
  // The beats keep the launcher known to be alive, never alive itself.
  timer.unref();
  return () => clearInterval(timer);
}
