-- A page of tasks is planned for the values of each call. A plan made once for any owner (the
-- pool's generic plans) takes the owner's share of tasks from the statistics: where one owner
-- held every task when they were taken, walking everyone's tasks newest first looks as good as
-- walking the owner's, and a page for an owner with none read the whole table (20 ms at
-- 100,000 tasks, over gRPC). Planned for the owner at hand, the owner's index wins.
ALTER FUNCTION tasks_page(text, text[], text, text, uuid, bigint)
    SET plan_cache_mode = force_custom_plan;
