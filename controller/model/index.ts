export * from "./snapshot.ts";
export * from "../../sdk/errors.ts";
export * from "./cluster.ts";
export * from "./fragmentation.ts";
