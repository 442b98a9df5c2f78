-- `questions.model_answer` keeps its statistics after all: a claim's statement finds the question
-- that resumed a task by it (`model_answer IS NOT NULL`, store/batch.rs).
ALTER TABLE questions ALTER COLUMN model_answer SET STATISTICS -1;
