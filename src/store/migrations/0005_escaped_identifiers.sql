-- Identifiers (users, hold ids, consume keys, adjust ids, jobs) may hold U+0000 from now on. Postgres
-- text cannot, so src/store/postgres/storedText.ts stores an identifier that holds U+0000, or that
-- starts with U+FFFF, as U+FFFF followed by the identifier with each backslash doubled and U+0000
-- written as \0. Rows written before could not hold U+0000, but an identifier of theirs could start
-- with U+FFFF: rewrite those into the new form, so that they are read back as they were written.
-- The rewrite is one to one; in the unlikely case that it would make two keys equal on the way (an
-- identifier x and another one equal to x's new form), the statement fails and the migration with it,
-- changing nothing.

update holds set user_id = chr(65535) || replace(user_id, '\', '\\') where left(user_id, 1) = chr(65535);
update holds set id = chr(65535) || replace(id, '\', '\\') where left(id, 1) = chr(65535);

update usage_ledger set user_id = chr(65535) || replace(user_id, '\', '\\') where left(user_id, 1) = chr(65535);
update usage_ledger set hold_id = chr(65535) || replace(hold_id, '\', '\\') where left(hold_id, 1) = chr(65535);
update usage_ledger set key = chr(65535) || replace(key, '\', '\\') where left(key, 1) = chr(65535);

update usage_totals set user_id = chr(65535) || replace(user_id, '\', '\\') where left(user_id, 1) = chr(65535);
update user_plans set user_id = chr(65535) || replace(user_id, '\', '\\') where left(user_id, 1) = chr(65535);
update user_limits set user_id = chr(65535) || replace(user_id, '\', '\\') where left(user_id, 1) = chr(65535);

update slots set user_id = chr(65535) || replace(user_id, '\', '\\') where left(user_id, 1) = chr(65535);
update slots set job = chr(65535) || replace(job, '\', '\\') where left(job, 1) = chr(65535);
