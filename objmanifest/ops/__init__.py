"""Operations on a task as a whole: garbage collection, repair, archiving and deletion.

Each works through the commit loop and the store seam; none is ever called by the data
path, and gc never deletes what an entry may still reference.
"""
