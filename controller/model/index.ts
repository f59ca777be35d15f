export * from "./snapshot.ts";
export * from "./errors.ts";
export * from "./cluster.ts";
export * from "./fragmentation.ts";
