WHERE = "the job's own reports module"
