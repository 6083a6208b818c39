-- A period never goes back (issue 19): per user, the latest instant a decision was made at, as far as
-- the day (what periods are made of). A clock that steps back, or a process whose clock lags, decides
-- in the period of this instant until the clock reaches a later one; a load reads it, so a reload does
-- not bring back a period the user's decisions already left. Written at most once per user and day.
create table period_floors (
  user_id text primary key,
  floor_at bigint not null
);
