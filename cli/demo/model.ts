import { crc32c } from "../../native/index.ts";
import type { CheckpointItemInput, CheckpointView } from "../../sdk/contract/checkpoint/index.ts";

/**
 * A small stand-in for one data-parallel replica's training state: parameters, an SGD momentum
 * buffer, the step counter and the replica's random-number generator. Every iteration draws
 * the (all-reduced, hence shared) gradient noise from that generator and updates every
 * parameter, so a lost byte, a wrong step or a restored-but-stale generator all change the
 * final digest. Replicas of one job start from the same seed and stay bit-identical.
 */
export interface TrainState {
  readonly params: Float32Array;
  readonly momentum: Float32Array;
  /** Iterations completed so far; the next one to run. */
  step: number;
  /** xorshift32 state, never 0. */
  rng: number;
}

const LEARNING_RATE = 0.01;
const MOMENTUM = 0.9;
const WEIGHT_DECAY = 0.01;

function nextRng(x: number): number {
  x ^= x << 13;
  x ^= x >>> 17;
  x ^= x << 5;
  return x >>> 0;
}

/** A job's seed from its id, so every replica of a job starts alike without being told. */
export function seedOf(job: string): number {
  return crc32c(new TextEncoder().encode(job)) || 1;
}

/** `bytes` of state, split evenly between parameters and momentum. */
export function initialState(seed: number, bytes: number): TrainState {
  const elements = Math.max(1, Math.floor(bytes / 8));
  const params = new Float32Array(elements);
  let rng = seed >>> 0 || 1;
  for (let i = 0; i < elements; i++) {
    rng = nextRng(rng);
    params[i] = rng / 0x1_0000_0000 - 0.5;
  }
  return { params, momentum: new Float32Array(elements), step: 0, rng };
}

/** Noise values drawn per iteration; the gradient of element i uses `noise[(i + shift) % NOISE]`. */
const NOISE = 4096;

/** Runs one iteration in place. */
export function trainStep(state: TrainState): void {
  const { params, momentum } = state;
  const noise = new Float64Array(NOISE);
  let rng = state.rng;
  for (let k = 0; k < NOISE; k++) {
    rng = nextRng(rng);
    noise[k] = (rng / 0x1_0000_0000 - 0.5) * 1e-3;
  }
  rng = nextRng(rng);
  const shift = rng % NOISE;
  for (let i = 0; i < params.length; i++) {
    const gradient = WEIGHT_DECAY * params[i]! + noise[(i + shift) & (NOISE - 1)]!;
    const m = MOMENTUM * momentum[i]! + gradient;
    momentum[i] = m;
    params[i] = params[i]! - LEARNING_RATE * m;
  }
  state.rng = rng;
  state.step += 1;
}

const bytesOf = (array: Float32Array) => new Uint8Array(array.buffer, array.byteOffset, array.byteLength);

function counters(state: TrainState): Uint8Array {
  const bytes = new Uint8Array(16);
  const view = new DataView(bytes.buffer);
  view.setBigUint64(0, BigInt(state.step), true);
  view.setUint32(8, state.rng, true);
  return bytes;
}

/** The state as checkpoint items, named like a PyTorch state dict; no copy is made. */
export function checkpointItems(state: TrainState): CheckpointItemInput[] {
  const tensor = (fqn: string, array: Float32Array): CheckpointItemInput => ({
    fqn,
    kind: "tensor",
    dtype: "float32",
    chunks: [{ sizes: [array.length], data: bytesOf(array) }],
  });
  return [
    tensor("model.weight", state.params),
    tensor("optim.state.0.momentum_buffer", state.momentum),
    { fqn: "trainer.counters", kind: "bytes", data: counters(state) },
  ];
}

/** Copies the state out of a checkpoint view, so the staging buffer can be unmapped. */
export function restoreState(view: CheckpointView): TrainState {
  const tensor = (fqn: string) => {
    const [chunk] = view.chunks(fqn);
    if (!chunk) throw new Error(`checkpoint has no chunk of ${fqn}`);
    return new Float32Array(chunk.data.slice().buffer);
  };
  const raw = view.bytes("trainer.counters");
  const counters = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
  return {
    params: tensor("model.weight"),
    momentum: tensor("optim.state.0.momentum_buffer"),
    step: Number(counters.getBigUint64(0, true)),
    rng: counters.getUint32(8, true),
  };
}

/** CRC32C over every byte of the state, as 8 hex digits. */
export function digest(state: TrainState): string {
  let crc = crc32c(bytesOf(state.params));
  crc = crc32c(bytesOf(state.momentum), crc);
  return (crc32c(counters(state), crc) >>> 0).toString(16).padStart(8, "0");
}
