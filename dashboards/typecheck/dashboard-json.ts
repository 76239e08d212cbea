// The type a dashboard's JSON must have: Grafana's dashboard model (`Dashboard` of
// @grafana/schema) with its string enums as the strings Grafana stores (`FieldColorModeId.Thresholds`
// is "thresholds" in JSON).
import type { Dashboard } from '@grafana/schema';

export type Json<T> = T extends string
  ? `${T}`
  : T extends number | boolean | null | undefined
    ? T
    : T extends ReadonlyArray<infer U>
      ? Array<Json<U>>
      : T extends object
        ? { [K in keyof T]: Json<T[K]> }
        : T;

export type DashboardJson = Json<Dashboard>;
