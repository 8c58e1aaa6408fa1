"""Operations on a task as a whole: garbage collection, repair, archiving and deletion.

Each works through the commit loop and the store seam; none is called by the data path.
"""
