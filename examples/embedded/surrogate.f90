! A Fortran application that trains a surrogate on a split of its communicator through the module ddp (ddp.f90):
! the Fortran twin of surrogate.c. Ranks 0..T-1 train (all ranks at 1 or 2, all but the last at 3 or more);
! between steps every rank uses its own communicators (a ring on the training communicator whose receives match
! any source and tag, an allreduce on MPI_COMM_WORLD). The surrogate learns f(a, b) = sin(2a) cos(b) on
! [-1, 1]^2 from samples drawn as a simulation would produce them: each step trains on the new samples, which then
! enter a replay buffer, and once more on a batch the buffer draws. It prints the held-out mean squared error
! before and after, and saves and reloads a checkpoint.
!
!   mpirun -np 3 surrogate_f [CHECKPOINT_DIR]
program surrogate_f
  use mpi
  use ddp
  use, intrinsic :: iso_c_binding, only: c_float, c_double, c_int64_t
  implicit none
  integer, parameter :: batch = 64, neval = 256, steps = 300, replay_capacity = 2048
  integer :: ierr, provided, rank, nranks, trainers, color, train, trank, tsize, step, i, status, failures, worst
  integer :: incoming, mine, request, ring_errors, one, all
  integer :: mpistatus(MPI_STATUS_SIZE)
  logical :: trains
  type(ddp_session) :: session, refused
  type(ddp_model) :: model, restored
  type(ddp_optimizer) :: optimizer, restored_optimizer
  type(ddp_replay_buffer) :: replay
  real(c_float) :: x(2, batch), y(1, batch), ex(2, neval), ey(1, neval), prediction(1, neval)
  real(c_double) :: loss, before, after, mean_before, mean_after, restored_mse
  integer(c_int64_t) :: loaded_step, held, added
  character(len=256) :: dir

  call MPI_Init_thread(MPI_THREAD_MULTIPLE, provided, ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  dir = "surrogate_f_checkpoints"
  if (command_argument_count() >= 1) call get_command_argument(1, dir)
  trainers = nranks
  if (nranks >= 3) trainers = nranks - 1
  trains = rank < trainers
  color = MPI_UNDEFINED
  if (trains) color = 0
  call MPI_Comm_split(MPI_COMM_WORLD, color, rank, train, ierr)
  failures = 0
  ring_errors = 0

  if (.not. trains) then
    ! Left out of the split: a session on MPI_COMM_NULL is refused with a code and a message.
    status = ddp_session_create(train, "cpu", refused)
    if (status /= DDP_ERROR_INVALID_ARGUMENT .or. index(ddp_last_error(), "MPI_COMM_NULL") == 0) then
      print *, "rank", rank, ": a session on MPI_COMM_NULL gave", status, ddp_last_error()
      failures = failures + 1
    end if
  end if

  call random_seed_for(rank)
  call draw(ex, ey)
  if (trains) then
    call check(ddp_session_create(train, "cpu", session))
    call check(ddp_session_rank(session, trank))
    call check(ddp_session_size(session, tsize))
    call check(ddp_mlp_create(session, [2_c_int64_t, 32_c_int64_t, 32_c_int64_t, 1_c_int64_t], "tanh", &
        7_c_int64_t, model))
    call check(ddp_model_distribute(model))
    call check(ddp_optimizer_create_adamw(model, 1d-2, 0d0, optimizer))
    call check(ddp_replay_buffer_create(session, int(replay_capacity, c_int64_t), 2_c_int64_t, 1_c_int64_t, &
        5_c_int64_t, replay))
    before = mse(model)
  end if

  do step = 0, steps - 1
    if (trains) then
      call MPI_Irecv(incoming, 1, MPI_INTEGER, MPI_ANY_SOURCE, MPI_ANY_TAG, train, request, ierr)
      call draw(x, y)
      call check(ddp_train_step(model, optimizer, x, y, loss))
      call check(ddp_replay_buffer_add(replay, x, y))
      call check(ddp_train_step_replay(model, optimizer, replay, int(batch, c_int64_t), loss))
      mine = 1000 * step + trank
      call MPI_Send(mine, 1, MPI_INTEGER, mod(trank + 1, tsize), 17, train, ierr)
      call MPI_Wait(request, mpistatus, ierr)
      if (incoming /= 1000 * step + mod(trank + tsize - 1, tsize) .or. mpistatus(MPI_TAG) /= 17) then
        ring_errors = ring_errors + 1
      end if
    end if
    if (mod(step, 50) == 0) then
      one = 1
      call MPI_Allreduce(one, all, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
      if (all /= nranks) failures = failures + 1
    end if
  end do
  if (ring_errors > 0) then
    print *, "rank", rank, ":", ring_errors, "of the application's messages were wrong"
    failures = failures + 1
  end if

  if (trains) then
    call check(ddp_replay_buffer_size(replay, held, added))
    if (added /= int(steps, c_int64_t) * batch .or. held /= min(added, int(replay_capacity, c_int64_t))) then
      print *, "rank", rank, ": the replay buffer holds", held, "of", added, "samples added"
      failures = failures + 1
    end if
    call check(ddp_replay_buffer_destroy(replay))
    after = mse(model)
    call check(ddp_session_mean(session, before, mean_before))
    call check(ddp_session_mean(session, after, mean_after))
    call check(ddp_checkpoint_save(model, optimizer, trim(dir), int(steps, c_int64_t)))
    call check(ddp_mlp_create(session, [2_c_int64_t, 32_c_int64_t, 32_c_int64_t, 1_c_int64_t], "tanh", &
        99_c_int64_t, restored))
    call check(ddp_optimizer_create_adamw(restored, 1d-2, 0d0, restored_optimizer))
    call check(ddp_checkpoint_load(restored, restored_optimizer, trim(dir), loaded_step))
    restored_mse = mse(restored)
    if (loaded_step /= steps .or. restored_mse /= after) then
      print *, "rank", rank, ": the checkpoint gave step", loaded_step, "and mse", restored_mse
      failures = failures + 1
    end if
    if (.not. (mean_after < 0.1d0 * mean_before .and. mean_after < 0.01d0)) then
      print *, "rank", rank, ": the surrogate did not learn:", mean_before, "->", mean_after
      failures = failures + 1
    end if
    if (trank == 0) then
      write (*, '(a,i0,a,i0,a,i0,a,f7.5,a,f7.5,a,i0)') "surrogate_f: ranks=", nranks, " trainers=", tsize, &
          " steps=", steps, " mse ", mean_before, " -> ", mean_after, " checkpoint step ", loaded_step
    end if
    call check(ddp_optimizer_destroy(restored_optimizer))
    call check(ddp_model_destroy(restored))
    call check(ddp_optimizer_destroy(optimizer))
    call check(ddp_model_destroy(model))
    call check(ddp_session_destroy(session))
    call MPI_Comm_free(train, ierr)
  end if
  call MPI_Allreduce(failures, worst, 1, MPI_INTEGER, MPI_MAX, MPI_COMM_WORLD, ierr)
  if (rank == 0) then
    if (worst == 0) then
      print '(a)', "surrogate_f: OK"
    else
      print '(a)', "surrogate_f: FAILED"
    end if
  end if
  call MPI_Finalize(ierr)
  if (worst /= 0) stop 1

contains

  subroutine check(code)
    integer, intent(in) :: code
    if (code /= DDP_OK) then
      print *, "surrogate_f: rank", rank, "error", code, ": ", ddp_last_error()
      call MPI_Abort(MPI_COMM_WORLD, 1, ierr)
    end if
  end subroutine

  subroutine random_seed_for(r)
    integer, intent(in) :: r
    integer :: n
    integer, allocatable :: seed(:)
    call random_seed(size=n)
    allocate(seed(n))
    seed = 12345 + 977 * r + [(i, i = 1, n)]
    call random_seed(put=seed)
  end subroutine

  subroutine draw(xs, ys)
    real(c_float), intent(out) :: xs(:, :), ys(:, :)
    call random_number(xs)
    xs = 2 * xs - 1
    ys(1, :) = sin(2 * xs(1, :)) * cos(xs(2, :))
  end subroutine

  real(c_double) function mse(m)
    type(ddp_model), intent(in) :: m
    call check(ddp_predict(m, ex, prediction))
    mse = sum((real(prediction(1, :), c_double) - ey(1, :))**2) / neval
  end function

end program surrogate_f
