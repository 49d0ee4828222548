"""The run-folder contract, shared by every writer and reader (standard library only).

    runfolder.layout     file and folder names of a run folder
    runfolder.info       run.json and trial.json as typed values, and FORMAT_VERSION
    runfolder.plan       a trial's plan: targets, apply/revert actions, policy, expectation
    runfolder.events     the event kinds and their fields; the recorder and the reader
    runfolder.explore    an explore folder's record (explore.json, tried.jsonl, found files)
    runfolder.shrinking  explore's shrinking candidates, for its loop and for its page's replay

The harness writes run folders through it, `reports` reads them through it (and nothing
else of the harness), so a stored run can be re-analyzed without re-running it.
"""
