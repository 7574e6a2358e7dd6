-- The two tables that carry token ids keep their parts in ClickHouse's compact format (all columns in
-- one file) until a part holds 256 MiB: the sink's inserts and their first merges. In the wide format
-- (the default from 10 MiB) every part is two files per column, about 60 for `spans`, created at each
-- insert and deleted at each merge; measured on the data plane's bench, that file churn was a third
-- of the store's CPU. Parts merged past 256 MiB are written wide, as before.

ALTER TABLE {db}.spans MODIFY SETTING min_bytes_for_wide_part = 268435456;

ALTER TABLE {db}.transitions MODIFY SETTING min_bytes_for_wide_part = 268435456;
